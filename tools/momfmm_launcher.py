#!/usr/bin/python3
"""The launcher of the Python tools (docs/design.md §8.8): tools/momfmm_report.py,
tools/momfmm_plot.py and tools/momfmm_tokenize.py each call launch() with their name, and it runs
the package's main() of that tool (momfmm.report, momfmm.plot, momfmm.tokenizer), the same as the
console scripts momfmm-report, momfmm-plot and momfmm-tokenize of an installed package
(pyproject.toml).

The package is the one of this source tree (tools/../python; in an installed share/momfmm the
same, cmake --install), loaded by its location, else the installed momfmm. Run directly, the
first argument names the tool: `momfmm_launcher.py report RUN ...`.
"""
import importlib
import importlib.util
import os
import sys

TOOLS = {"report": "momfmm.report", "plot": "momfmm.plot", "tokenize": "momfmm.tokenizer"}


def use_source_package():
    """Imports the momfmm package of ../python as `momfmm` when there is one, by its location
    (the import system's own file-location loader; sys.path is left as it is), so that a tool
    runs the package beside it rather than another installed copy."""
    init = os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "python", "momfmm", "__init__.py")
    if not os.path.isfile(init):
        return
    spec = importlib.util.spec_from_file_location("momfmm", init,
                                                  submodule_search_locations=[os.path.dirname(init)])
    package = importlib.util.module_from_spec(spec)
    sys.modules["momfmm"] = package
    spec.loader.exec_module(package)


def launch(tool):
    """Runs the main() of `tool` ("report", "plot" or "tokenize") and exits with its code."""
    use_source_package()
    sys.exit(importlib.import_module(TOOLS[tool]).main())


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in TOOLS:
        sys.exit(f"usage: {os.path.basename(sys.argv[0])} {'|'.join(TOOLS)} [ARGUMENTS ...]")
    tool = sys.argv.pop(1)
    launch(tool)
