#!/usr/bin/python3
"""The Python tools at the edges of their input (docs/design.md §8.8, docs/cli.md §5, docs/files.md §4),
one table per class, without the momfmm binary:

1. hostile command-line values for momfmm-tokenize: each is one line on stderr naming the value
   or file, exit 2 (a value) or 3 (a file), no traceback, nothing left half-written; a corpus with
   bytes that are not UTF-8 trains and decodes back to its bytes;
2. checkpoint names at their limits: momfmm.files.checkpoint_step accepts exactly the names
   ckpt_<step %08d>.h5 of steps 0 .. 2^63-1; run directories are ordered by step as a number
   (ckpt_100000000.h5 after ckpt_99999999.h5) by every reader; only momfmm.files lists a run
   directory (the tokenizer's corpus walk aside);
3. symbolic links and non-regular files as outputs and inputs of every tool and writer: an
   output that is a link, a FIFO, a directory or an input is refused (exit 2) and left as it
   was; an input that is a FIFO, a directory or a device is refused (exit 3) within seconds;
4. a run directory whose newest checkpoint is damaged: the report and the figures read the
   older one with a warning, as momfmm inspect does; a locked one stops them (exit 3);
5. the Python config reader against the binary's: momfmm.config.KEYS row for row against
   CONFIG_KEYS in the C source, and numbers as strtoll/strtod read them.

    PYTHONPATH=python /usr/bin/python3 -m pytest tests/python/test_hostile_inputs.py
"""
import ast
import os
import re
import stat
import subprocess
import sys
import time

import numpy as np
import pytest
from checkpoints import write_checkpoint

from momfmm import config, files, h5, rundir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = os.path.join(ROOT, "tools")
PYTHON = "/usr/bin/python3"
TIMEOUT = 60
INI = ("[model]\nvocab_size = 16\nd_model = 8\nn_heads = 2\nn_layers = 1\nd_ff = 16\n[momentum]\ngamma = 0.25\n"
       "[data]\nseq_len = 8\nchain_len = 4\n")


def tool(name, *args, cwd=None):
    """(exit code, stdout bytes, stderr text, seconds) of tools/momfmm_<name>.py ARGS."""
    start = time.time()
    r = subprocess.run([PYTHON, os.path.join(TOOLS, f"momfmm_{name}.py"), *map(str, args)], capture_output=True,
                       timeout=TIMEOUT, cwd=cwd, env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    return r.returncode, r.stdout, r.stderr.decode("utf-8", "replace"), time.time() - start


def assert_one_line(code, err, want, needles, what):
    lines = err.strip().splitlines()
    assert code == want, f"{what}: exit {code}, expected {want}: {err[-800:]}"
    assert len(lines) == 1 and "Traceback" not in err, f"{what}: not one line: {err[-800:]}"
    for needle in needles:
        assert needle in lines[0], f"{what}: {needle!r} not in {lines[0]!r}"


def run_ckpt(directory, step, **kw):
    os.makedirs(directory, exist_ok=True)
    evals = {"step": [step], "loss": [2.0 + 1.0 / (step + 1)]}
    return write_checkpoint(os.path.join(directory, files.checkpoint_name(step)), INI, step,
                            train={"step": [step], "loss": [3.0]}, evals=evals, **kw)


# ---------------------------------------------------------------- 1. momfmm-tokenize's values
@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    """A corpus, a trained model, its train.bin and assorted hostile files."""
    d = tmp_path_factory.mktemp("tok")
    corpus = d / "corpus"
    corpus.mkdir()
    rng = np.random.default_rng(3)
    words = ["momentum", "attention", "field", "near", "far", "é", "→", "\n", "x = 1;"]
    for i in range(3):
        (corpus / f"d{i}.txt").write_text(" ".join(rng.choice(words, 300)))
    (corpus / "raw.txt").write_bytes(b"latin-1 caf\xe9, a lone \xff and \xc3 cut, then text\n" * 20)
    code, out, err, _ = tool("tokenize", "train", corpus, "--vocab-size", 300, "--out", d / "model")
    assert code == 0, err
    (d / "empty.txt").write_bytes(b"")
    (d / "hidden").mkdir()
    (d / "hidden" / ".secret.txt").write_text("not read")
    (d / "odd.bin").write_bytes(b"\x01\x00\x02")
    np.array([5, 6, 300], "<u2").tofile(d / "far_id.bin")
    header = np.zeros(256, "<i4")
    header[:3] = 20240520, 7, 3
    (d / "v7.bin").write_bytes(header.tobytes() + np.array([5, 6, 7], "<u2").tobytes())
    header[:3] = 20240520, 1, 30
    (d / "lying.bin").write_bytes(header.tobytes() + np.array([5, 6, 7], "<u2").tobytes())
    (d / "short_llmc.bin").write_bytes(header.tobytes()[:100])
    import h5py
    with h5py.File(d / "chunked.h5", "w") as f:
        f.create_dataset("tokens", data=np.arange(100, dtype=np.uint16), chunks=(10,), compression="gzip")
    with h5py.File(d / "float.h5", "w") as f:
        f["tokens"] = np.arange(10, dtype=np.float32)
    with h5py.File(d / "big_endian.h5", "w") as f:
        f["tokens"] = np.arange(10, dtype=">u2")
    with h5py.File(d / "two_d.h5", "w") as f:
        f["tokens"] = np.ones((2, 5), np.uint16)
    with h5py.File(d / "loss_tokens.h5", "w") as f:  # momfmm loss's kind (docs/files.md §4)
        f["inputs"] = f["targets"] = np.ones((2, 5), np.int32)
    with h5py.File(d / "linked.h5", "w") as f:
        f["tokens"] = h5py.ExternalLink(str(d / "fifo"), "/tokens")
    (d / "text_file").write_text("some text")
    os.mkfifo(d / "fifo")
    os.symlink(d / "text_file", d / "link_out.bin")
    return d


TOKENIZE_CASES = [
    # (case, arguments with {d} for the fixture's directory, exit code, needles)
    ("missing corpus", "train {d}/nope --vocab-size 300 --out {d}/o1", 3, ("nope", "No such file")),
    ("--vocab-size 0", "train {d}/corpus --vocab-size 0 --out {d}/o2", 2, ("--vocab-size 0",)),
    ("--vocab-size -5", "train {d}/corpus --vocab-size -5 --out {d}/o2", 2, ("--vocab-size -5",)),
    ("--vocab-size abc", "train {d}/corpus --vocab-size abc --out {d}/o2", 2, ("abc",)),
    ("--vocab-size 2^24 + 1", "train {d}/corpus --vocab-size 16777217 --out {d}/o2", 2, ("16777217",)),
    ("--vocab-size past uint16", "train {d}/corpus --vocab-size 70000 --out {d}/o2", 2, ("--format hdf5",)),
    ("--vocab-size below the corpus's characters", "train {d}/corpus --vocab-size 260 --out {d}/o2", 2,
     ("--vocab-size 260",)),
    ("--out an existing file", "train {d}/corpus --vocab-size 300 --out {d}/text_file", 2, ("--out", "text_file")),
    ("an empty item in the corpus list", "train {d}/text_file, --vocab-size 300 --out {d}/o3", 3, ("empty path",)),
    ("an empty corpus file", "train {d}/empty.txt --vocab-size 300 --out {d}/o3", 3, ("empty.txt", "empty")),
    ("a FIFO as the corpus", "train {d}/fifo --vocab-size 300 --out {d}/o3", 3, ("fifo", "FIFO")),
    ("a directory of hidden files", "train {d}/hidden --vocab-size 300 --out {d}/o3", 3, ("no non-empty",)),
    ("a model file that is not one", "encode --model {d}/text_file {d}/corpus --out {d}/e.bin", 3,
     ("text_file", "not a sentencepiece model")),
    ("a missing model", "encode --model {d}/none.model {d}/corpus --out {d}/e.bin", 3, ("none.model",)),
    ("a FIFO as the model", "ids --model {d}/fifo abc", 3, ("fifo", "FIFO")),
    ("encode --out onto the corpus", "encode --model {d}/model/tokenizer.model {d}/text_file --out {d}/text_file",
     2, ("is the input",)),
    ("encode --out a symbolic link", "encode --model {d}/model/tokenizer.model {d}/text_file --out {d}/link_out.bin",
     2, ("symbolic link",)),
    ("encode --out a directory", "encode --model {d}/model/tokenizer.model {d}/text_file --out {d}/hidden", 2,
     ("not a regular file",)),
    ("encode --out a FIFO", "encode --model {d}/model/tokenizer.model {d}/text_file --out {d}/fifo", 2,
     ("FIFO",)),
    ("an id past the pieces", "decode --model {d}/model/tokenizer.model 5 300", 2, ("id 300",)),
    ("a negative id", "decode --model {d}/model/tokenizer.model -1", 2, ("id -1",)),
    ("ids and a file", "decode --model {d}/model/tokenizer.model 5 {d}/odd.bin", 2, ("odd.bin",)),
    ("an odd-sized .bin", "decode --model {d}/model/tokenizer.model {d}/odd.bin", 3, ("odd.bin", "3 bytes")),
    ("a token id past the pieces", "decode --model {d}/model/tokenizer.model {d}/far_id.bin", 3,
     ("token id 300 at token 2",)),
    ("llm.c version 7", "decode --model {d}/model/tokenizer.model {d}/v7.bin", 3, ("version 7",)),
    ("llm.c declaring more tokens", "decode --model {d}/model/tokenizer.model {d}/lying.bin", 3,
     ("declares 30 tokens",)),
    ("llm.c shorter than its header", "decode --model {d}/model/tokenizer.model {d}/short_llmc.bin", 3,
     ("header",)),
    ("HDF5 chunked", "decode --model {d}/model/tokenizer.model {d}/chunked.h5", 3, ("memory-mapped",)),
    ("HDF5 float ids", "decode --model {d}/model/tokenizer.model {d}/float.h5", 3, ("integers",)),
    ("HDF5 big-endian", "decode --model {d}/model/tokenizer.model {d}/big_endian.h5", 3, ("little-endian",)),
    ("HDF5 2-D", "decode --model {d}/model/tokenizer.model {d}/two_d.h5", 3, ("1-D",)),
    ("HDF5 /tokens an external link to a FIFO", "decode --model {d}/model/tokenizer.model {d}/linked.h5", 3,
     ("external link",)),
    ("HDF5 of another kind", "decode --model {d}/model/tokenizer.model {d}/loss_tokens.h5", 3,
     ("loss_tokens.h5: a token file of /inputs and /targets (momfmm loss), not a token file of /tokens",)),
    ("an HDF5 file as the corpus", "train {d}/chunked.h5 --vocab-size 300 --out {d}/o4", 3,
     ("chunked.h5: an HDF5 file, not a text document",)),
    ("an llm.c token file as the corpus", "encode --model {d}/model/tokenizer.model {d}/v7.bin --out {d}/e.bin", 3,
     ("v7.bin: an llm.c token file, not a text document",)),
    ("an HDF5 file as the model", "ids --model {d}/chunked.h5 abc", 3,
     ("chunked.h5: not a sentencepiece model", "an HDF5 file")),
    ("an empty token file", "decode --model {d}/model/tokenizer.model {d}/empty.txt", 3, ("empty",)),
    ("a FIFO as the token file", "decode --model {d}/model/tokenizer.model {d}/fifo", 3, ("FIFO",)),
    ("a directory as the token file", "decode --model {d}/model/tokenizer.model {d}/hidden", 3, ("directory",)),
    ("an unknown command", "untrain", 2, ("untrain",)),
]


@pytest.mark.parametrize("case,args,code,needles", TOKENIZE_CASES, ids=[c[0] for c in TOKENIZE_CASES])
def test_tokenize_refuses_in_one_line(tok, case, args, code, needles):
    before = sorted(os.listdir(tok))
    got, _, err, seconds = tool("tokenize", *args.format(d=tok).split())
    assert_one_line(got, err, code, needles, case)
    assert seconds < 30, f"{case}: {seconds:.1f} s"
    assert sorted(os.listdir(tok)) == before or case.startswith(("--vocab", "missing corpus", "an empty", "a FIFO",
                                                                 "a directory of")), f"{case}: files left"
    assert os.readlink(tok / "link_out.bin") == str(tok / "text_file")
    assert (tok / "text_file").read_text() == "some text"
    assert stat.S_ISFIFO(os.lstat(tok / "fifo").st_mode)


def test_tokenize_keeps_bytes_that_are_not_utf8(tok):
    """A corpus file with bytes that are not UTF-8 (as momfmm train reads any bytes) trains, and
    its token file decodes to its bytes exactly (the bytes become byte pieces)."""
    raw = (tok / "corpus" / "raw.txt").read_bytes()
    code, out, err, _ = tool("tokenize", "encode", "--model", tok / "model" / "tokenizer.model", tok / "corpus" / "raw.txt",
                             "--out", tok / "raw.bin")
    assert code == 0, err
    code, out, err, _ = tool("tokenize", "decode", "--model", tok / "model" / "tokenizer.model", tok / "raw.bin")
    assert code == 0 and out == raw, (err, out[:80], raw[:80])
    code, out, err, _ = tool("tokenize", "decode", "--model", tok / "model" / "tokenizer.model", tok / "model" / "train.bin")
    docs = [(tok / "corpus" / n).read_bytes() for n in ("d0.txt", "d1.txt", "d2.txt", "raw.txt")]
    assert code == 0 and out == b"".join(docs), err  # </s> between documents prints nothing, as in generate


# ---------------------------------------------------------------- 2. checkpoint names
NAMES = [
    ("ckpt_00000100.h5", 100), ("ckpt_00000000.h5", 0), ("ckpt_99999999.h5", 99999999),
    ("ckpt_100000000.h5", 100000000), ("ckpt_1234567890123.h5", 1234567890123),
    ("ckpt_9223372036854775807.h5", 2**63 - 1), ("ckpt_9223372036854775808.h5", None),
    ("ckpt_12345678901234567890.h5", None), ("ckpt_" + "9" * 40 + ".h5", None),
    ("ckpt_100.h5", None), ("ckpt_0000100.h5", None), ("ckpt_000000100.h5", None), ("ckpt_0100000000.h5", None),
    ("ckpt_-1.h5", None), ("ckpt_-0000001.h5", None), ("ckpt_+0000001.h5", None), ("ckpt_ 0000001.h5", None),
    ("ckpt_1e3.h5", None), ("ckpt_00001e03.h5", None), ("ckpt_0000010a.h5", None), ("ckpt_0x000010.h5", None),
    ("ckpt_\uff10\uff10\uff10\uff10\uff10\uff10\uff11\uff10.h5", None),  # fullwidth digits
    ("ckpt_\u0660\u0660\u0660\u0660\u0660\u0660\u0661\u0660.h5", None),  # Arabic-Indic digits
    ("ckpt_00000100.h5.tmp.4242", None), ("ckpt_00000100.h5\n", None), (" ckpt_00000100.h5", None),
    ("CKPT_00000100.h5", None), ("ckpt_00000100.H5", None), ("ckpt_00000100.hdf5", None), ("ckpt_.h5", None),
    ("ckpt_00000100", None), ("best.h5", None), ("metrics.h5", None), ("ckpt_00000100.h5/", None),
]


@pytest.mark.parametrize("name,step", NAMES, ids=[repr(n[0]) for n in NAMES])
def test_checkpoint_names(name, step):
    assert files.checkpoint_step(name) == step
    if step is not None:
        assert files.checkpoint_name(step) == name


JOBS_LIB = os.path.join(ROOT, "jobs", "momfmm_lib.sh")


def shell(script, *args):
    """Runs bash with jobs/momfmm_lib.sh sourced: (status, stdout, stderr)."""
    p = subprocess.run(["bash", "-c", f'me=test; . "{JOBS_LIB}"; ' + script, "bash", *args],
                       capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def test_shell_checkpoint_names_are_the_packages():
    """The job scripts' is_checkpoint_name (jobs/momfmm_lib.sh) accepts exactly the names
    momfmm.files.checkpoint_step accepts: the NAMES table and 300 random near-misses."""
    import random
    rng = random.Random(5)
    names = [n for n, _ in NAMES if "\n" not in n]
    for _ in range(300):
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 21)))
        names.append(f"ckpt_{digits}.h5")
        names.append(files.checkpoint_name(rng.randint(0, 2**63 - 1)))
    code, out, err = shell('for n in "$@"; do if is_checkpoint_name "$n"; then echo 1; else echo 0; fi; done', *names)
    assert code == 0, err
    got = out.split()
    assert len(got) == len(names)
    wrong = [n for n, g in zip(names, got) if (g == "1") != (files.checkpoint_step(n) is not None)]
    assert not wrong, wrong[:10]


def test_shell_newest_checkpoint_orders_by_step(tmp_path):
    """newest_checkpoint takes ckpt_100000000.h5 over ckpt_99999999.h5 and skips names that are
    not checkpoints; checkpoint_name reads steps as decimal (010 is 10, 08 is 8) and refuses
    anything else with exit 2."""
    d = tmp_path / "run"
    d.mkdir()
    for name in ("ckpt_99999999.h5", "ckpt_100000000.h5", "ckpt_999999999.h5.tmp.1", "ckpt_1e10.h5",
                 "ckpt_0999999999.h5", "ckpt_9999999999999999999.h5"):
        (d / name).write_bytes(b"")
    assert shell('newest_checkpoint "$1"', str(d))[:2] == (0, "ckpt_100000000.h5\n")
    assert shell('newest_checkpoint "$1"', str(tmp_path / "none"))[:2] == (1, "")
    for step, name in (("010", "ckpt_00000010.h5"), ("08", "ckpt_00000008.h5"), ("0", "ckpt_00000000.h5"),
                       ("123456789", "ckpt_123456789.h5"), (str(2**63 - 1), files.checkpoint_name(2**63 - 1))):
        assert shell('checkpoint_name "$1"', step)[:2] == (0, name + "\n"), step
    for bad in ("1x", "-1", "", "1e3", str(2**63), " 5"):
        code, _, err = shell('checkpoint_name "$1"', bad)
        assert code == 2 and err.count("\n") == 1, (bad, err)


def test_run_directories_are_ordered_by_step(tmp_path):
    """ckpt_100000000.h5 is newer than ckpt_99999999.h5 (lexically it sorts first): every reader
    of a run directory takes it; names that are not checkpoints are not listed."""
    d = tmp_path / "run"
    for step in (2, 99999999, 100000000):
        run_ckpt(str(d), step)
    for junk in ("ckpt_999999999999999999999.h5", "ckpt_1e9.h5", "ckpt_00000003.h5.tmp.1", "best.h5"):
        (d / junk).write_bytes(b"not a checkpoint")
    assert [s for s, _ in files.list_checkpoints(str(d))] == [2, 99999999, 100000000]
    assert h5.newest_checkpoint(str(d)).endswith("ckpt_100000000.h5")
    run = rundir.load_run(str(d))
    assert run.ckpt_step == 100000000 and run.step == 100000000
    code, out, err, _ = tool("report", d, "--metrics", "loss")
    assert code == 0 and "| 100000000 |" in out.decode(), err


LISTERS = {("momfmm/files.py", "list_checkpoints"), ("momfmm/tokenizer.py", "_walk")}


def test_only_the_name_parser_lists_run_directories():
    """os.listdir, os.scandir, os.walk and glob appear in the package and the tools only in
    momfmm.files.list_checkpoints (run directories) and the tokenizer's corpus walk."""
    found = set()
    paths = [os.path.join(b, f) for b, _, fs in os.walk(os.path.join(ROOT, "python")) for f in fs if f.endswith(".py")]
    paths += [os.path.join(TOOLS, f) for f in os.listdir(TOOLS) if f.startswith("momfmm") and f.endswith(".py")]
    for path in paths:
        tree = ast.parse(open(path).read(), path)
        for fn in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)] + [tree]:
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                        node.func.attr in ("listdir", "scandir", "walk", "glob", "iglob") and
                        isinstance(node.func.value, ast.Name) and node.func.value.id in ("os", "glob")):
                    found.add((os.path.relpath(path, os.path.join(ROOT, "python")), getattr(fn, "name", None)))
    assert {f for f in found if f[1] is not None} <= LISTERS, sorted(found)



def test_only_the_shell_library_spells_checkpoint_names():
    """No job script or shell tool globs ckpt_*.h5 or formats ckpt_%08d itself: they call
    jobs/momfmm_lib.sh's is_checkpoint_name, newest_checkpoint and checkpoint_name."""
    scripts = [os.path.join(ROOT, "jobs", f) for f in os.listdir(os.path.join(ROOT, "jobs"))
               if f.endswith((".sh", ".sbatch")) and f != "momfmm_lib.sh"]
    scripts += [os.path.join(TOOLS, f) for f in os.listdir(TOOLS) if f.endswith(".sh")]
    offenders = []
    for path in scripts:
        for number, line in enumerate(open(path), 1):
            code = line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
            if re.search(r"ckpt_(\*|%0?8?d)", code):
                offenders.append(f"{os.path.relpath(path, ROOT)}:{number}: {line.strip()}")
    assert not offenders, offenders


# ---------------------------------------------------------------- 3. links and special files
@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "run"
    run_ckpt(str(d), 4)
    return d


def special(tmp_path, kind):
    """A path that is a symbolic link to a regular file, a FIFO or a directory."""
    path = tmp_path / f"special_{kind}"
    if kind == "link":
        (tmp_path / "target.txt").write_text("target")
        os.symlink(tmp_path / "target.txt", path)
    elif kind == "dangling link":
        os.symlink(tmp_path / "nowhere", path)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    return path


KINDS = ("link", "dangling link", "fifo", "directory")


@pytest.mark.parametrize("kind", KINDS)
def test_outputs_are_never_links_or_special_files(tmp_path, run_dir, kind):
    """report --out, a figure of plot, momfmm.pt.save/export, a results digest: exit 2 (or
    ArgumentError), the link and its target, the FIFO or the directory left as they were."""
    out = special(tmp_path, kind)
    before = (os.readlink(out) if os.path.islink(out) else None, os.lstat(out).st_mode)
    code, _, err, seconds = tool("report", run_dir, "--out", out)
    assert_one_line(code, err, 2, ("--out", str(out)), f"report --out {kind}")
    figures = tmp_path / "figs"
    figures.mkdir()
    os.rename(out, figures / "loss.png")
    code, _, err, seconds = tool("plot", run_dir, "--out", figures)
    assert_one_line(code, err, 2, ("loss.png",), f"plot onto a {kind} loss.png")
    os.rename(figures / "loss.png", out)
    import momfmm.pt as mt
    from momfmm.digest import write_digest
    model = mt.load(h5.newest_checkpoint(str(run_dir)))
    for what, write in (("pt.save", lambda: mt.save(model, str(out))),
                        ("pt.export", lambda: mt.export(h5.newest_checkpoint(str(run_dir)), str(out))),
                        ("write_digest", lambda: write_digest(str(out), rundir.load_run(str(run_dir))))):
        with pytest.raises(files.ArgumentError):
            write()
    assert (os.readlink(out) if os.path.islink(out) else None, os.lstat(out).st_mode) == before
    if kind == "link":
        assert (tmp_path / "target.txt").read_text() == "target"
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")], "a temporary was left"


def test_report_out_is_never_an_input(tmp_path, run_dir):
    ckpt = h5.newest_checkpoint(str(run_dir))
    before = open(ckpt, "rb").read()
    code, _, err, _ = tool("report", run_dir, "--out", ckpt)
    assert_one_line(code, err, 2, ("is the input",), "report --out onto the checkpoint it reads")
    assert open(ckpt, "rb").read() == before


@pytest.mark.parametrize("kind", ("fifo", "directory", "dangling link"))
def test_inputs_are_regular_files(tmp_path, run_dir, kind):
    """A FIFO, a directory or a dangling link where a file is read: exit 3 within seconds, for
    report, plot, momfmm.pt.load, load_tokens, a digest and a suite list."""
    path = special(tmp_path, kind)
    if kind != "directory":
        for name in ("report", "plot"):
            args = [path] + (["--out", tmp_path / "figs"] if name == "plot" else [])
            code, _, err, seconds = tool(name, *args)
            assert_one_line(code, err, 3, (str(path),), f"{name} of a {kind}")
            assert seconds < 30
    import momfmm.pt as mt
    from momfmm.digest import read_digest
    for read in (mt.load, h5.load_tokens, read_digest, h5.read_metrics_file):
        with pytest.raises(files.RunError):
            read(str(path))
    code, _, err, _ = tool("report", "--results", "--runs", tmp_path, "--suite", path)
    assert code == 2 and "--suite" in err and len(err.strip().splitlines()) == 1, err


def test_a_fifo_under_a_checkpoint_name_is_skipped(run_dir):
    """As for momfmm inspect DIR: a FIFO named ckpt_<newer>.h5 does not load (and does not block);
    the older checkpoint is read, with a warning naming the FIFO."""
    fifo = run_dir / files.checkpoint_name(9)
    os.mkfifo(fifo)
    code, out, err, seconds = tool("report", run_dir)
    assert code == 0 and "ckpt_00000009.h5" in err and "FIFO" in err and "| 4 |" in out.decode(), err
    assert seconds < 30


# ---------------------------------------------------------------- 4. damaged newest checkpoint
def test_damaged_newest_falls_back(tmp_path):
    d = tmp_path / "run"
    run_ckpt(str(d), 4)
    newest = run_ckpt(str(d), 8)
    data = open(newest, "rb").read()
    open(newest, "wb").write(data[:len(data) // 2])
    code, out, err, _ = tool("report", d, "--metrics", "loss")
    assert code == 0 and "| 4 |" in out.decode(), err
    assert "skipping checkpoint that does not load" in err and "ckpt_00000008.h5" in err, err
    code, out, err, _ = tool("plot", d, "--out", tmp_path / "figs")
    assert code == 0 and "ckpt_00000008.h5" in err and (tmp_path / "figs" / "loss.png").exists(), err
    os.remove(files.list_checkpoints(str(d))[0][1])
    code, out, err, _ = tool("report", d)
    assert code == 3 and "no checkpoint in this run directory loads" in err.strip().splitlines()[-1], err


def test_locked_newest_does_not_fall_back(tmp_path):
    """A newest checkpoint another process holds open for writing stops the readers (exit 3), as
    it stops momfmm inspect DIR: falling back would show an older state without a word."""
    d = tmp_path / "run"
    run_ckpt(str(d), 4)
    newest = run_ckpt(str(d), 8)
    holder = subprocess.Popen([PYTHON, "-c", "import h5py, sys\nf = h5py.File(sys.argv[1], 'a')\n"
                               "print('open', flush=True)\nsys.stdin.read()", newest],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        code, out, err, _ = tool("report", d)
        assert code == 3 and "locked" in err and "not falling back" in err, err
    finally:
        holder.communicate("", timeout=30)
    code, out, err, _ = tool("report", d, "--metrics", "loss")
    assert code == 0 and "| 8 |" in out.decode(), err


# ---------------------------------------------------------------- 5. the config reader
def c_keys():
    """{(section, name): (type, default, min, max, choices)} of CONFIG_KEYS in the C source."""
    source = None
    for base, _, names in os.walk(os.path.join(ROOT, "src")):
        for name in names:
            if name.endswith(".c"):
                text = open(os.path.join(base, name), errors="replace").read()
                if re.search(r"const config_key CONFIG_KEYS\[\] = \{", text):
                    source = text
    assert source, "CONFIG_KEYS not found under src/"
    table = source[source.index("CONFIG_KEYS[] = {"):]
    table = table[:table.index("\n};")]
    table = re.sub(r"/\*.*?\*/", "", table, flags=re.S)
    env = {"BIG": 1e18, "NULL": None, "CONFIG_FMM_KERNELS": config.FMM_KERNELS}
    for name, value in re.findall(r"^#define (\w+) ([0-9.eE+-]+)", source, re.M):  # the table's own limits
        env.setdefault(name, float(value))
    out = {}
    for row in re.findall(r"\{(\"[^{}]*)\}", table):
        fields = [f.strip() for f in re.split(r",(?![^(]*\))", row)]
        section, name, kind, _, default, lo, hi, choices = (fields[0], fields[1], fields[2], fields[3],
                                                             fields[4], fields[5], fields[6], fields[7])
        out[(ast.literal_eval(section), ast.literal_eval(name))] = (
            kind.replace("KEY_", "").lower(), ast.literal_eval(default), float(eval(lo, {}, env)),
            float(eval(hi, {}, env)), eval(choices, {}, env))
    return out


def test_config_keys_are_the_binarys():
    python = {(k.section, k.name): (k.type, k.default, float(k.min), float(k.max), k.choices) for k in config.KEYS}
    c = c_keys()
    assert list(python) == list(c), "the keys differ (or their order)"
    for key in c:
        assert python[key] == c[key], f"{key}: Python {python[key]} vs C {c[key]}"


NUMBERS = [
    # (text, type, value or None for a refusal)
    ("5", "int", 5), ("+5", "int", 5), ("-0", "int", 0), ("\n5", "int", 5), ("5 ", "int", None),
    ("1_0", "int", None), ("0x10", "int", None), ("1e3", "int", None), ("", "int", None), ("\u0665", "int", None),
    ("1e3", "double", 1000.0), (".5", "double", 0.5), ("5.", "double", 5.0), ("0x1p4", "double", 16.0),
    ("0X.8", "double", 0.5), ("1_0", "double", None), ("1e", "double", None), ("inf", "double", None),
    ("nan", "double", None), ("1e400", "double", None), ("1e-400", "double", None), ("0e500", "double", 0.0),
    ("1e-310", "double", 1e-310), ("\u0665", "double", None),
]


@pytest.mark.parametrize("text,kind,value", NUMBERS, ids=[repr(n[:2]) for n in NUMBERS])
def test_numbers_parse_as_strtoll_and_strtod(text, kind, value):
    key = config.Key("x", "y", kind, "0", -config.BIG, config.BIG)
    if value is None:
        with pytest.raises(config.ConfigError):
            config.set_value(key, text)
    else:
        assert config.set_value(key, text) == value


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
