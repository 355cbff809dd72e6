#!/usr/bin/python3
"""Checks of the Python package python/momfmm (docs/design.md §8.8).

    PYTHONPATH=python /usr/bin/python3 tests/python/test_package.py        (or: pytest tests/python)

1. Every module of the package imports on its own in a fresh interpreter with only
   PYTHONPATH=python (no module relies on another having been imported first).
2. The package's import graph, read from the sources with ast, has no cycle.
3. Nothing in the package, the tools or the tests touches sys.path (PYTHONPATH, an installed
   copy, or for the tools the package beside them loaded by location); the tools in tools/
   import no other tool, but for the three entry scripts momfmm_report.py, momfmm_plot.py and
   momfmm_tokenize.py, which import the one launcher (momfmm_launcher.py) and only call it.
4. momfmm.h5 reads a small checkpoint and token file written with h5py in the docs/files.md §4
   layout: load_checkpoint's fields and load_tokens' arrays.
5. The report's and the plot tool's modules import neither matplotlib nor scipy: each is
   imported where it is first used (a figure drawn, a t-test), so a run that needs neither
   (--help, --no-figures, an error) does not wait 0.7 s for them.
"""
import ast
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON_DIR = os.path.join(ROOT, "python")
PACKAGE_DIR = os.path.join(PYTHON_DIR, "momfmm")
TOOLS_DIR = os.path.join(ROOT, "tools")
PACKAGE = "momfmm"
LAUNCHER = "momfmm_launcher"
ENTRY_SCRIPTS = {"momfmm_report": "report", "momfmm_plot": "plot", "momfmm_tokenize": "tokenize"}


def package_modules():
    """{module name: source path} of every module of the package and its subpackages ("momfmm",
    "momfmm.h5", "momfmm.results", "momfmm.results.claims", ...); __main__ files, which run a
    program when imported, aside."""
    out = {}
    for base, dirs, files in os.walk(PACKAGE_DIR):
        dirs[:] = sorted(d for d in dirs if os.path.isfile(os.path.join(base, d, "__init__.py")))
        rel = os.path.relpath(base, PACKAGE_DIR)
        package = PACKAGE if rel == os.curdir else ".".join([PACKAGE] + rel.split(os.sep))
        for entry in sorted(files):
            if entry.endswith(".py") and entry != "__main__.py":
                stem = entry[:-3]
                out[package if stem == "__init__" else f"{package}.{stem}"] = os.path.join(base, entry)
    return out


def is_package(module, modules):
    return os.path.basename(modules[module]) == "__init__.py"


def imported_modules(tree, module, modules):
    """Package modules that `module`'s syntax tree imports, wherever the import statement is
    (a function-level import closes a cycle as surely as a top-level one)."""
    package = module if is_package(module, modules) else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x, from .h5 import y
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            # `from momfmm import plot` imports momfmm.plot; `from momfmm.h5 import x`, momfmm.h5
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                     for a in node.names]
        else:
            continue
        found |= {name for name in names if name in modules and name != module}
    return found


def import_graph():
    modules = package_modules()
    graph = {}
    for module, path in modules.items():
        with open(path) as f:
            graph[module] = imported_modules(ast.parse(f.read(), path), module, modules)
    return graph


def find_cycle(graph):
    """One import cycle as a list of modules (first == last), or None."""
    state = {}  # module -> "open" while on the search path, "done" after

    def visit(module, path):
        state[module] = "open"
        for dep in sorted(graph[module]):
            if state.get(dep) == "open":
                return path[path.index(dep):] + [dep]
            if dep not in state:
                cycle = visit(dep, path + [dep])
                if cycle:
                    return cycle
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module, [module])
            if cycle:
                return cycle
    return None


def uses_sys_path(tree):
    return any(isinstance(node, ast.Attribute) and node.attr == "path"
               and isinstance(node.value, ast.Name) and node.value.id == "sys"
               for node in ast.walk(tree))


class PackageTest(unittest.TestCase):
    def test_every_module_imports_alone(self):
        env = dict(os.environ, PYTHONPATH=PYTHON_DIR, MPLBACKEND="Agg")
        for module in package_modules():
            with self.subTest(module=module):
                r = subprocess.run([sys.executable, "-c", f"import {module}"], env=env,
                                   cwd=tempfile.gettempdir(), capture_output=True, text=True)
                self.assertEqual(r.returncode, 0, f"import {module}: {r.stderr.strip()}")

    def test_report_and_plot_import_light(self):
        env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
        code = ("import sys, momfmm.results.cli, momfmm.plot; "
                "print(sorted({m.split('.')[0] for m in sys.modules} & {'matplotlib', 'scipy'}))")
        r = subprocess.run([sys.executable, "-c", code], env=env, cwd=tempfile.gettempdir(),
                           capture_output=True, text=True)
        self.assertEqual((r.returncode, r.stdout.strip()), (0, "[]"), r.stderr.strip())

    def test_no_import_cycle(self):
        graph = import_graph()
        cycle = find_cycle(graph)
        self.assertIsNone(cycle, "import cycle: " + " -> ".join(cycle or []))
        for module, deps in sorted(graph.items()):
            print(f"  {module} imports {', '.join(sorted(deps)) or '(nothing of the package)'}")

    def test_no_sys_path_anywhere(self):
        """Neither the package nor the tools nor the tests: the package is found through
        PYTHONPATH or an installed copy (the tools load the one beside them by location)."""
        paths = list(package_modules().values())
        for top in (TOOLS_DIR, os.path.join(ROOT, "tests")):
            for base, dirs, files in os.walk(top):
                dirs[:] = [d for d in dirs if d != "__pycache__"]
                paths += [os.path.join(base, f) for f in sorted(files) if f.endswith(".py")]
        for path in paths:
            with self.subTest(path=os.path.relpath(path, ROOT)), open(path) as f:
                self.assertFalse(uses_sys_path(ast.parse(f.read(), path)), f"{path} touches sys.path")

    def test_tools_import_no_other_tool(self):
        """A script in tools/ imports no other one, but the launcher: the entry scripts call its launch(),
        the benchmark scripts that use the package load it through its use_source_package()."""
        tools = {e[:-3] for e in os.listdir(TOOLS_DIR) if e.endswith(".py")}
        for name in sorted(tools):
            path = os.path.join(TOOLS_DIR, name + ".py")
            with open(path) as f:
                tree = ast.parse(f.read(), path)
            imported = set()
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    imported |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module:
                    imported.add(node.module.split(".")[0])
            allowed = {LAUNCHER} if name != LAUNCHER else set()
            with self.subTest(tool=name):
                self.assertFalse((imported & tools) - allowed, f"{path} imports {sorted(imported & tools)}")

    def test_entry_scripts_only_call_the_launcher(self):
        """One launcher for the three tools (docs/design.md §8.8): each entry script imports
        launch from momfmm_launcher, defines nothing and calls launch with its own name; the
        launcher maps each name to a module of the package that has a main()."""
        for name, tool in ENTRY_SCRIPTS.items():
            path = os.path.join(TOOLS_DIR, name + ".py")
            with self.subTest(script=name), open(path) as f:
                tree = ast.parse(f.read(), path)
                defined = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.Assign))]
                calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
                self.assertEqual(defined, [], f"{path} defines more than the launcher's call")
                self.assertEqual([(c.func.id, [a.value for a in c.args]) for c in calls], [("launch", [tool])])
        env = dict(os.environ, PYTHONPATH="", PYTHONDONTWRITEBYTECODE="1")
        for name in ENTRY_SCRIPTS:
            with self.subTest(help=name):
                r = subprocess.run([sys.executable, os.path.join(TOOLS_DIR, name + ".py"), "--help"], env=env,
                                   cwd=tempfile.gettempdir(), capture_output=True, text=True, timeout=120)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn("usage:", r.stdout)

    def test_quoted_config_values(self):
        """config_ini's quoted values (docs/config.md §6, escaping) read as momfmm reads them."""
        from momfmm import h5
        cp = h5.config_parser()
        cp.read_string('[data]\npath = "a\\nb ;c#d \\"q\\" \\\\ \\x01\\xff caf\u00e9"\n'
                       '[train]\nout_dir = runs/50%\nplain = "\n')
        self.assertEqual(cp.get("data", "path"), 'a\nb ;c#d "q" \\ \x01\udcff caf\u00e9')
        self.assertEqual(os.fsencode(cp.get("data", "path"))[-7:], b"\xff caf\xc3\xa9")
        self.assertEqual(cp.get("train", "out_dir"), "runs/50%")
        with self.assertRaises(ValueError):
            cp.get("train", "plain")
        for bad in ('"abc', '"a\\qb"', '"a\\x00"', '"a" b'):
            with self.subTest(bad=bad), self.assertRaises(ValueError):
                h5.unquote_ini_value(bad)
        self.assertEqual(h5.unquote_ini_value('plain"text\\n'), 'plain"text\\n')

    def test_reader_round_trip(self):
        import h5py
        import numpy as np
        from checkpoints import write_checkpoint
        from momfmm import h5
        ini = "[model]\nvocab_size = 16\nd_model = 8\nn_heads = 2\nn_layers = 1\nd_ff = 16\n[momentum]\ngamma = 0.5\n"
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = write_checkpoint(os.path.join(tmp, "ckpt_00000007.h5"), ini, 7,
                                    train={"step": [1, 2, 3], "loss": [3.0, 2.0, 1.5]},
                                    attrs={"world_size": np.int32(2), "config_ini": np.bytes_(ini.encode())})
            weight = np.arange(24 * 8, dtype=np.float32).reshape(24, 8)
            with h5py.File(ckpt, "r+") as f:
                f["model/blocks/0/attn/qkv/weight"][()] = weight
                for group, scale in (("optim/m", 2), ("optim/v", 3)):
                    f.copy(f["model"], group)
                    f[group].visititems(lambda n, d: d.write_direct(np.abs(d[()])) if isinstance(d, h5py.Dataset)
                                        else None)
                    f[f"{group}/blocks/0/attn/qkv/weight"][()] = weight * scale
            tokens = os.path.join(tmp, "tokens.h5")
            with h5py.File(tokens, "w") as f:
                f.create_dataset("inputs", data=np.array([[1, 2]], np.int32))
                f.create_dataset("targets", data=np.array([[2, -1]], np.int32))

            ck = h5.load_checkpoint(ckpt)
            self.assertEqual(ck.step, 7)
            self.assertEqual(ck.attrs["world_size"], 2)
            self.assertEqual(ck.config.get("model", "d_model"), "8")  # a fixed-length config_ini
            self.assertEqual(ck.settings.get("model.d_model"), 8)
            np.testing.assert_array_equal(ck.params["blocks/0/attn/qkv/weight"], weight)
            np.testing.assert_array_equal(ck.optim_v["blocks/0/attn/qkv/weight"], weight * 3)
            self.assertEqual(sorted(ck.buffers), ["blocks/0/attn/prev_k", "blocks/0/attn/prev_q"])
            self.assertEqual(len(ck.datasets()), 3 * len(ck.params) + 2)
            self.assertEqual(ck.train["loss"].tolist(), [3.0, 2.0, 1.5])
            self.assertTrue(np.isnan(ck.train["lr"]).all())
            self.assertEqual(h5.newest_checkpoint(tmp), ckpt)
            self.assertEqual(h5.load_checkpoint(ckpt, optim=False, metrics=False).optim_m, {})

            inputs, targets, labels = h5.load_tokens(tokens)
            self.assertEqual(inputs.dtype, np.int64)
            np.testing.assert_array_equal(targets, [[2, -1]])
            self.assertIsNone(labels)
            with self.assertRaises(h5.RunError):
                h5.load_tokens(ckpt)
            with self.assertRaises(h5.RunError):
                h5.load_checkpoint(os.path.join(tmp, "missing.h5"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
