#!/usr/bin/python3
"""Checks the citations of the design documents (docs/README.md, "Citing a section").

    /usr/bin/python3 tools/check_docs.py [--root DIR] [--list]

Code, tests, tools and documents cite the design as `docs/model.md §1.2` (or,
inside docs/, as `model.md §1.2`). For every such citation in the files git
tracks (or, outside a checkout, every text file below the root), this checks
that the document exists and has a heading that carries the section
(`## §1.2 ...`, or the document's own `# §1` for a whole-document citation).
A citation of an issue by its number or title is refused as well: no
reader of the code can resolve it. So is a path of the repository
(`src/kernels/gemm.c`, `tools/check_docs.py`, `include/...`) that names
no file or folder of the tree: a stale path after a move. --list prints every citation with its
place, for reading them against what they cite.

Exits 0 when every citation resolves, else 1 after one line per problem.
"""
import argparse
import os
import re
import subprocess
import sys

CITATION = re.compile(r"(?:docs/)?\b([a-z_]+)\.md\s+((?:§\s?\d+(?:\.\d+)*(?:,\s*)?)+)")
SECTION = re.compile(r"§\s?(\d+(?:\.\d+)*)")
ISSUE = re.compile(r"\bissue(?:s)?\s+(?:\d+|\"|:)|\(issue[ :]|the (?:core|[A-Z][\w-]*) issue\b|issue \d+'s")
TEXT_ENDINGS = (".c", ".h", ".py", ".sh", ".md", ".txt", ".ini", ".cmake", ".sbatch", ".list", ".toml")
SKIP_DIRS = ("results/", "figures/", "build", ".git/")
# A path of the repository's own tree, as prose and comments write it.
REPO_PATH = re.compile(r"(?<![\w./$-])((?:src|include|tools|tests|jobs|configs|docs|python|cmake)/[\w./+-]*[\w/])")
# A path with a pattern or a placeholder in it names no one file.
NOT_A_PATH = re.compile(r"[*<>{}$]|\.\.\.|/[A-Za-z]\.\w+$")


def tracked_files(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files"], check=True, capture_output=True, text=True).stdout
        names = out.splitlines()
    except (OSError, subprocess.CalledProcessError):
        names = [os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs]
    return [n for n in names if (n.endswith(TEXT_ENDINGS) or os.path.basename(n) == "CMakeLists.txt")
            and not n.startswith(SKIP_DIRS) and n != "RESULTS.md"]


def document_sections(root):
    """{document name: set of section numbers its headings carry}."""
    sections = {}
    docs = os.path.join(root, "docs")
    for name in sorted(os.listdir(docs)):
        if name.endswith(".md"):
            with open(os.path.join(docs, name)) as f:
                heads = [line for line in f if line.startswith("#")]
            sections[name[:-3]] = {m for h in heads for m in SECTION.findall(h)}
    return sections


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    parser.add_argument("--list", action="store_true", help="print every citation with its place")
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    sections = document_sections(root)
    problems, count = [], 0
    for rel in tracked_files(root):
        path = os.path.join(root, rel)
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (UnicodeDecodeError, OSError):
            continue
        for lineno, line in enumerate(lines, 1):
            if ISSUE.search(line) and not rel.startswith(".ci"):
                problems.append(f"{rel}:{lineno}: cites an issue, which no reader can resolve: {line.strip()[:100]}")
            for m in REPO_PATH.finditer(line):
                rest = line[m.end():m.end() + 1]
                if NOT_A_PATH.search(m.group(1)) or rest in "*<{$" and rest:
                    continue
                if not os.path.exists(os.path.join(root, m.group(1).rstrip("/."))):
                    problems.append(f"{rel}:{lineno}: names {m.group(1)}, which is not in the tree")
            for doc, cited in CITATION.findall(line):
                if doc in ("README", "RESULTS", "SPEC") or not (rel.startswith("docs/") or f"docs/{doc}.md" in line):
                    continue
                for number in SECTION.findall(cited):
                    count += 1
                    if args.list:
                        print(f"{rel}:{lineno}: {doc}.md §{number}: {line.strip()[:110]}")
                    if doc not in sections:
                        problems.append(f"{rel}:{lineno}: cites docs/{doc}.md, which does not exist")
                    elif number not in sections[doc]:
                        have = ", ".join(f"§{s}" for s in sorted(sections[doc], key=lambda s: [int(p) for p in s.split(".")]))
                        problems.append(f"{rel}:{lineno}: cites docs/{doc}.md §{number}, which has no such section "
                                        f"(it has {have})")
    for p in problems:
        print(p)
    if problems:
        print(f"check_docs: {len(problems)} problem(s) in the citations of docs/")
        return 1
    print(f"check_docs: {count} citations of docs/, every one resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
