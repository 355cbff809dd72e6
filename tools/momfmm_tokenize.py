#!/usr/bin/python3
"""Subword tokens for the text task: train a sentencepiece model, write token files.

The command-line entry point of momfmm.tokenizer (python/momfmm/tokenizer.py; docs/design.md §8.8),
the same as the console script `momfmm-tokenize` of an installed package (pyproject.toml).

Usage and options: `momfmm_tokenize.py --help`. The package is the one of this source tree
(tools/../python; in an installed share/momfmm the same), else the installed momfmm.
"""
import importlib.util
import os
import sys


def use_source_package():
    """Imports the momfmm package of ../python as `momfmm` when there is one, by its location
    (the import system's own file-location loader; sys.path is left as it is), so that this
    script runs the package beside it rather than another installed copy."""
    init = os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "python", "momfmm", "__init__.py")
    if not os.path.isfile(init):
        return
    spec = importlib.util.spec_from_file_location("momfmm", init,
                                                  submodule_search_locations=[os.path.dirname(init)])
    package = importlib.util.module_from_spec(spec)
    sys.modules["momfmm"] = package
    spec.loader.exec_module(package)


if __name__ == "__main__":
    use_source_package()
    from momfmm import tokenizer
    sys.exit(tokenizer.main())
