#!/usr/bin/python3
"""Checks that the C program keeps the layers of docs/design.md §8.1.

    /usr/bin/python3 tools/check_layers.py [--root DIR] [--summary]

With --summary it also prints, layer by layer from the top, each folder's
files and lines and the folders it uses, and the count of folder-to-folder
arrows (the README's "Layout" quotes it).

The layer table is read from docs/design.md itself (the table under "§8.1"), so
the document and the check cannot drift apart. Each row names a layer and, in
backticks, its folder under src/ (`src/kernels/`); rows run from the top layer
down. A module is one .c file with the header of the same name beside it.
Then, for every C file under src/:

1. it lies in a folder of the table (a folder the table omits is an error);
2. each `#include "folder/x.h"` of the project names a header of its own layer
   or of a layer below; a header included by its bare name ("config_table.h")
   is private to its folder and must lie beside the file that includes it;
3. each call of a function declared in a project header goes to a module of
   its own layer or below;
4. a function declared in a module's header is defined in that folder, so a
   header cannot declare what a file of another layer implements;
5. the modules' dependencies (includes and calls) form no cycle, inside a
   layer too: each arrow runs one way;
6. every function and type a header exports carries its module's prefix:
   the module's name or its first word ("h5reader_", "cmd_" for
   cmd_common.h, "metric" for metrics.h), or one of the prefixes the header
   lists on a line "Prefixes: a_ b_" of its comments (kernels.h: one per
   kernel family);
7. every function a header exports is called from another file (of src/,
   tests/ or tools/): an export nothing calls is dead or should be static;
8. only the files of the parallel runtime's folder (the row whose folder is
   `src/parallel/`) call MPI (a call of an MPI_ function) or include <mpi.h>.

Exits 0 when all hold, else 1 after one line per violation. Reads the code as
text (comments and strings removed), which the project's plain C allows.
"""
import argparse
import os
import re
import sys

SECTION = "## §8.1"
CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "defined", "_Static_assert", "__attribute__",
            "_Alignof", "alignof", "offsetof", "va_arg", "__typeof__", "typeof", "_Generic"}


def strip_code(text):
    """The text with comments, string and character literals blanked (line breaks kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def read_table(root):
    """[(layer, [folders])] from the top layer down, from docs/design.md §8.1."""
    path = os.path.join(root, "docs", "design.md")
    with open(path) as f:
        lines = f.read().splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith(SECTION))
    except StopIteration:
        sys.exit(f"{path}: no section '{SECTION}'")
    rows, in_table = [], False
    for line in lines[start + 1:]:
        if line.startswith("## "):
            break
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if in_table and len(cells) >= 2 and not set(cells[0]) <= set("-: "):
                folders = re.findall(r"`src/(\w+)/`", cells[1])
                rows.append((cells[0], folders))
            in_table = True
        elif in_table and rows:
            break
    if not rows:
        sys.exit(f"{path}: no layer table under '{SECTION}'")
    return rows


def project_files(root):
    """{path under src/ ("kernels/gemm.c"): full path} of every C source and header of the program."""
    files, src = {}, os.path.join(root, "src")
    for folder, _, names in sorted(os.walk(src)):
        for name in sorted(names):
            if name.endswith((".c", ".h")):
                full = os.path.join(folder, name)
                files[os.path.relpath(full, src)] = full
    return files


def caller_files(root):
    """{path: full path} of the C files outside src/ that may call the program's functions."""
    files = {}
    for folder in ("tests", "tools"):
        for name in sorted(os.listdir(os.path.join(root, folder))):
            if name.endswith((".c", ".h")):
                files[f"{folder}/{name}"] = os.path.join(root, folder, name)
    return files


def module_of(name):
    """"kernels/gemm" of kernels/gemm.c and .h; a folder's private X_internal.h is module X's."""
    stem = name[:-2]
    return stem[:-len("_internal")] if stem.endswith("_internal") else stem


def folder_of(name):
    return os.path.dirname(name)


def declared_functions(code):
    """Names of the functions a header declares or defines (static inline), at file scope."""
    names, depth = set(), 0
    statement = []
    for ch in code:
        if ch == "{":
            if depth == 0:
                names |= names_in_declaration("".join(statement))
                statement = []
            depth += 1
        elif ch == "}":
            depth -= 1
        elif depth == 0:
            if ch == ";":
                names |= names_in_declaration("".join(statement))
                statement = []
            else:
                statement.append(ch)
    return names


def names_in_declaration(text):
    text = re.sub(r"^\s*#.*$", "", text, flags=re.M).strip()
    if not text or text.startswith(("typedef", "struct", "enum", "union")) or "(*" in text.replace(" ", ""):
        return set()
    m = re.match(r"[\w\s\*]*?\b([A-Za-z_]\w*)\s*\(", text)
    if not m or m.group(1) in KEYWORDS or m.group(1) == "__attribute__":
        return set()
    return {m.group(1)}


def exported_types(code):
    """Type names a header defines at file scope (typedef ... name; and } name;)."""
    names, depth, statement = set(), 0, []
    for ch in code:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if depth == 0 and ch == ";":
            text = re.sub(r"^\s*#.*$", "", "".join(statement), flags=re.M).strip()
            if text.startswith("typedef"):
                m = re.search(r"\(\s*\*\s*(\w+)\s*\)\s*\(", text) or re.search(r"(\w+)\s*$", text)
                if m:
                    names.add(m.group(1))
            statement = []
        elif depth == 0 or ch in "{}":
            statement.append(ch)
    return names


def allowed_prefixes(header, raw):
    module = module_of(header)
    first = module.split("_")[0]
    prefixes = {module, first, first[:-1] if first.endswith("s") else first}
    for line in re.findall(r"Prefixes:([^\n*]*)", raw):
        prefixes |= set(line.split())
    return prefixes


def defined_functions(code):
    """Non-static functions a .c file defines (name followed by a body at file scope)."""
    names, depth, statement = set(), 0, []
    for ch in code:
        if ch == "{":
            if depth == 0:
                head = re.sub(r"^\s*#.*$", "", "".join(statement), flags=re.M).strip()
                m = re.search(r"\b([A-Za-z_]\w*)\s*\([^()]*(\([^()]*\)[^()]*)*\)\s*$", head)
                if m and not re.search(r"\bstatic\b", head) and "=" not in head and m.group(1) not in KEYWORDS:
                    names.add(m.group(1))
            statement = []
            depth += 1
        elif ch == "}":
            depth -= 1
            statement = []
        elif depth == 0:
            statement = [] if ch == ";" else statement + [ch]
    return names


def find_cycle(graph):
    """One dependency cycle as a list of modules (first == last), or None."""
    state = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt, path + [nxt])
                if found:
                    return found
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [node])
            if found:
                return found
    return None


def read_code(path):
    with open(path) as f:
        raw = f.read()
    return raw, strip_code(raw)


def check_prefixes(codes, files, problems):
    """{exported function or type: header}; a problem for each name without its module's prefix."""
    exported = {}
    for name, (raw, code) in sorted(codes.items()):
        if name.endswith(".h"):
            prefixes = allowed_prefixes(os.path.basename(name), raw)
            for fn in sorted(declared_functions(code) | exported_types(code)):
                exported.setdefault(fn, name)
                if not any(fn.startswith(p) for p in prefixes):
                    problems.append(f"{files[name]}: exports {fn}, without the module's prefix "
                                    f"({' or '.join(sorted(p + '_' if not p.endswith('_') else p for p in prefixes))})")
    return exported


def check_dependencies(codes, files, layer_of, layer_name, exported, problems):
    """{module: modules it includes or calls}; a problem for each include or call that runs upward."""
    depends = {}
    for name, (raw, code) in sorted(codes.items()):
        if name not in layer_of:
            continue
        mine = layer_of[name]
        uses = depends.setdefault(module_of(name), set())
        for lineno, line in enumerate(raw.splitlines(), 1):
            m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
            if not m:
                continue
            target = m.group(1)
            if "/" not in target:  # a folder's private header, beside its user
                target = os.path.join(folder_of(name), target)
                if target not in files:
                    problems.append(f"{files[name]}:{lineno}: includes \"{m.group(1)}\", which is not beside it "
                                    f"(a header of another folder is included as \"folder/{m.group(1)}\")")
                    continue
            if target in files and module_of(target) != module_of(name):
                uses.add(module_of(target))
            if target in layer_of and layer_of[target] > mine:
                problems.append(f"{files[name]}:{lineno}: includes {target} of layer '{layer_name[target]}', "
                                f"above its own layer '{layer_name[name]}'")
        for lineno, line in enumerate(code.splitlines(), 1):
            for fn in CALL.findall(line):
                header = exported.get(fn)
                if not header or header not in layer_of or module_of(header) == module_of(name):
                    continue
                uses.add(module_of(header))
                if layer_of[header] > mine:
                    problems.append(f"{files[name]}:{lineno}: calls {fn}() of {header} (layer "
                                    f"'{layer_name[header]}'), above its own layer '{layer_name[name]}'")
    return depends


def check_unused_exports(codes, callers, exported, problems, files):
    """A problem for each exported function that no file but its definer's module calls."""
    called = {}
    for name, (_, code) in list(codes.items()) + list(callers.items()):
        words = re.findall(r"\b([A-Za-z_]\w*)\b", code)
        for fn in set(words):
            if fn not in exported:
                continue
            # another module's use, or a header's own use (an inline function or a macro of
            # that header calls it, and expands in its callers)
            if module_of(exported[fn]) != module_of(name) or (name == exported[fn] and words.count(fn) > 1):
                called.setdefault(fn, name)
    functions = {fn for name, (_, code) in codes.items() if name.endswith(".h") for fn in declared_functions(code)}
    for fn in sorted(functions):
        if fn in exported and fn not in called:
            problems.append(f"{files[exported[fn]]}: exports {fn}(), which no other file calls "
                            f"(make it static, or remove it)")


def check_mpi(codes, files, mpi_folders, problems):
    """A problem for each MPI call or <mpi.h> outside the parallel runtime's folder."""
    for name, (raw, code) in sorted(codes.items()):
        if folder_of(name) in mpi_folders:
            continue
        for lineno, line in enumerate(code.splitlines(), 1):
            m = re.search(r"\bP?MPI_[A-Z]\w*\s*\(", line)
            if m:
                problems.append(f"{files[name]}:{lineno}: calls {m.group(0)[:-1].strip()}(): only the "
                                f"parallel runtime (src/{' or src/'.join(sorted(mpi_folders))}/) calls MPI")
        for lineno, line in enumerate(raw.splitlines(), 1):
            if re.match(r"\s*#\s*include\s*<mpi\.h>", line):
                problems.append(f"{files[name]}:{lineno}: includes <mpi.h>: only the parallel runtime calls MPI")


def print_summary(table, files, codes, depends):
    """Layer by layer: each folder's files, lines and the folders its modules use."""
    arrows = set()
    for module, used in depends.items():
        for other in used:
            if folder_of(other) != folder_of(module):
                arrows.add((folder_of(module), folder_of(other)))
    for name, folders in table:
        for folder in folders:
            mine = [f for f in files if folder_of(f) == folder]
            lines = sum(codes[f][0].count("\n") for f in mine)
            uses = sorted(b for a, b in arrows if a == folder)
            print(f"{name:18} src/{folder + '/':12} {len(mine):3} files {lines:6} lines  uses {' '.join(uses) or '-'}")
    print(f"{len(arrows)} arrows between {sum(len(f) for _, f in table)} folders")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    parser.add_argument("--summary", action="store_true", help="print each folder's size and the folders it uses")
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    table = read_table(root)
    files = project_files(root)
    layer_of, layer_name, folder_layer = {}, {}, {}
    for depth, (name, folders) in enumerate(table):
        for folder in folders:
            folder_layer[folder] = (len(table) - depth, name)  # higher number, higher layer
    problems = []
    for name in files:
        if folder_of(name) in folder_layer:
            layer_of[name], layer_name[name] = folder_layer[folder_of(name)]
        else:
            problems.append(f"{files[name]}: its folder src/{folder_of(name)}/ is not in the layer table "
                            f"of docs/design.md §8.1")
    codes = {name: read_code(path) for name, path in files.items()}
    callers = {name: read_code(path) for name, path in caller_files(root).items()}
    exported = check_prefixes(codes, files, problems)
    definers = {}
    for name, (_, code) in codes.items():
        if name.endswith(".c"):
            for fn in defined_functions(code):
                definers[fn] = name
    for fn, header in sorted(exported.items()):
        where = definers.get(fn)
        if where and module_of(where) != module_of(header) and folder_of(where) != folder_of(header):
            problems.append(f"{files[where]}: defines {fn}(), which {header} (layer '{layer_name.get(header)}') "
                            f"declares: a header declares only what its own folder implements")
    depends = check_dependencies(codes, files, layer_of, layer_name, exported, problems)
    cycle = find_cycle(depends)
    if cycle:
        problems.append("modules depend on each other in a circle: " + " -> ".join(cycle))
    check_unused_exports(codes, callers, exported, problems, files)
    check_mpi(codes, files, {f for f, (_, layer) in folder_layer.items() if f == "parallel"}, problems)
    if args.summary:
        print_summary(table, files, codes, depends)
    for p in problems:
        print(os.path.relpath(p.split(":")[0], root) + p[len(p.split(":")[0]):] if p.startswith(root) else p)
    if problems:
        print(f"check_layers: {len(problems)} violation(s) of the layers of docs/design.md §8.1")
        return 1
    print(f"check_layers: {len(files)} files in {len(folder_layer)} folders of {len(table)} layers, "
          f"no include or call runs upward, no export unused, MPI only in src/parallel/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
