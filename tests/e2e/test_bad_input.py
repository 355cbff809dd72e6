"""Bad input (docs/cli.md §5): every case exits with the documented code (2 config
or command line, 3 file) and a one-line message naming the file and the key
or value (with a "did you mean" where one fits, and the range of a number
out of range); no crash, and input files are left untouched. Also the
messages that used to be wrong: `inspect metrics.h5`, `inspect`
and `eval` of a run directory."""
import hashlib
import os
import shutil

import h5py
import numpy as np
import pytest

from common import run, tiny_config, write_config, write_tokens
from file_kinds import KIND_NAMES, make_kinds


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def expected_failure(result, code, needles):
    """(ok, detail): exit `code` with every needle in stderr, and no crash."""
    msg = result.stderr.strip()
    ok = result.returncode == code and all(n in msg for n in needles)
    ok = ok and "Segmentation" not in msg and "AddressSanitizer" not in msg
    return ok, f"rc {result.returncode} (want {code}); stderr: {msg[:300]!r}"


def expect(report, name, result, code, *needles):
    report.check(name, *expected_failure(result, code, needles))


# The command line of each case uses INI (the case's own file, holding its
# text), GOOD (a valid config) or NOPE (a missing file).
INI, GOOD, NOPE = "<ini>", "<good>", "<nope>"
# (case, INI file name, its text, momfmm arguments, exit code, needles in the message)
CONFIG_CASES = [
    ("unknown section", "section.ini", "[model]\nd_model = 32\n[modle]\nn_heads = 4\n", ["train", INI],
     2, ("section.ini:4", "modle")),
    ("unknown key", "key.ini", "[model]\nd_model = 32\nd_modle = 4\n", ["train", INI],
     2, ("key.ini:3", "model.d_modle")),
    ("non-numeric value", "value.ini", "[model]\nd_model = abc\n", ["train", INI],
     2, ("value.ini:2", "model.d_model", "abc")),
    ("negative size", "neg.ini", "[model]\nn_layers = -1\n", ["train", INI], 2, ("neg.ini:2", "model.n_layers")),
    ("d_model not divisible by n_heads", "div.ini", "[model]\nd_model = 30\nn_heads = 4\n", ["train", INI], 2,
     ("div.ini", "model.d_model", "model.n_heads")),
    ("odd head dimension", "odd.ini", "[model]\nd_model = 12\nn_heads = 4\n", ["train", INI], 2, ("odd.ini", "odd")),
    ("unknown task", "task.ini", "[data]\ntask = sorting\n", ["train", INI],
     2, ("task.ini:2", "data.task", "sorting")),
    ("unknown attention kind", "kind.ini", "[attention]\nkind = flash\n", ["train", INI],
     2, ("kind.ini:2", "attention.kind")),
    ("fmm bandwidth < 0", "band.ini", "[attention]\nkind = fmm\n[fmm]\nbandwidth = -1\n", ["train", INI],
     2, ("band.ini:4", "fmm.bandwidth")),
    ("unknown fmm kernel", "kern.ini", "[attention]\nkind = fmm\n[fmm]\nkernels = elu,relu\n", ["train", INI],
     2, ("kern.ini", "fmm.kernels", "relu")),
    ("fmm chunk <= 0", "chunk.ini", "[attention]\nkind = fmm\n[fmm]\nchunk = 0\n", ["train", INI],
     2, ("chunk.ini:4", "fmm.chunk")),
    ("bad boolean", "bool.ini", "[model]\ncausal = maybe\n", ["train", INI], 2, ("bool.ini:2", "model.causal")),
    ("malformed INI line", "garbage.ini", "[model\nd_model = 32\n", ["train", INI], 2, ("garbage.ini:1")),
    ("missing config file", None, None, ["train", NOPE], 2, ("nope.ini")),
    ("--set unknown key", None, None, ["train", GOOD, "--set", "model.nope=1"], 2, ("model.nope")),
    ("--set bad value", None, None, ["train", GOOD, "--set", "train.lr=fast"], 2, ("train.lr", "fast")),
    ("--set without section", None, None, ["train", GOOD, "--set", "lr=1"], 2, ("lr=1")),
    ("unknown command", None, None, ["fly"], 2, ("fly")),
    ("missing argument", None, None, ["train"], 2, ("missing")),
    ("unknown option", None, None, ["train", GOOD, "--fast"], 2, ("--fast")),
    ("init without --out", None, None, ["init", GOOD], 2, ("--out")),
    # suggestions (edit distance, aliases) and ranges
    ("key train.lrr", "lrr.ini", "[train]\nlrr = 1\n", ["train", INI], 2,
     ("lrr.ini:2", "unknown key train.lrr", "did you mean train.lr?")),
    ("alias train.learning_rate", "lr_alias.ini", "[train]\nlearning_rate = 1\n", ["train", INI], 2,
     ("lr_alias.ini:2", "train.learning_rate", "did you mean train.lr?")),
    ("alias model.n_head", "heads.ini", "[model]\nn_head = 2\n", ["train", INI], 2,
     ("heads.ini:2", "model.n_head", "did you mean model.n_heads?")),
    ("key momentum.gama", "gama.ini", "[momentum]\ngama = 0.5\n", ["train", INI], 2,
     ("gama.ini:2", "momentum.gama", "did you mean momentum.gamma?")),
    ("--set train.lrr", None, None, ["train", GOOD, "--set", "train.lrr=1"], 2, ("train.lrr", "did you mean train.lr?")),
    ("--set learning_rate", None, None, ["train", GOOD, "--set", "train.learning_rate=1"], 2,
     ("train.learning_rate", "did you mean train.lr")),
    ("command trian", None, None, ["trian"], 2, ("unknown command 'trian'", "did you mean train?")),
    ("train.steps=-5 states the range", None, None, ["train", GOOD, "--set", "train.steps=-5"], 2,
     ("train.steps = -5 is out of range", "must be in [0, 9007199254740992]")),
    # docs/config.md §6: quoted values, '#' comments, numbers beyond a double, control bytes
    ("lr = 1e400 is out of range", "huge.ini", "[train]\nlr = 1e400\n", ["train", INI], 2,
     ("huge.ini:2", "train.lr = 1e400 is out of range", "beyond what a double holds")),
    ("unknown escape in a quoted value", "escape.ini", '[data]\npath = "a\\qb"\n', ["train", INI], 2,
     ("escape.ini:2", "data.path", "unknown escape \\q")),
    ("\\x00 in a quoted value", "nul.ini", '[data]\npath = "a\\x00"\n', ["train", INI], 2,
     ("nul.ini:2", "data.path", "NUL")),
    ("unclosed quote", "quote.ini", '[train]\nout_dir = "runs/x\n', ["train", INI], 2,
     ("quote.ini:2", "train.out_dir", "no closing quote")),
    ("a NUL byte in a config file", "nulbyte.ini", "[model]\nd_model = 32\0\n", ["train", INI], 2,
     ("nulbyte.ini", "NUL byte at offset")),
    ("'#' comment after a value", "hash.ini", "[model]\nd_model = 30 # thirty\nn_heads = 4\n", ["train", INI], 2,
     ("hash.ini", "model.d_model = 30 is not divisible")),
    ("control bytes shown escaped", "ctrl.ini", "[model]\nd_model = 3\x1b[2J\n", ["train", INI], 2,
     ("ctrl.ini:2", "3\\x1b[2J")),
    ("out_dir an existing file", "outfile.ini", "[train]\nout_dir = /dev/null\n", ["train", INI], 2,
     ("train.out_dir = /dev/null: exists and is not a directory",)),
    ("out_dir empty", "outempty.ini", "[train]\nout_dir =\n", ["train", INI], 2,
     ("train.out_dir = '': an empty path names no directory",)),
]
# generate --stop (docs/cli.md §5): the escapes of a quoted config value, decoded strictly,
# before the checkpoint is read (NOPE: a malformed --stop is reported, not the missing file)
CONFIG_CASES += [(f"generate --stop {stop!r}", None, None, ["generate", NOPE, "--prompt", "1", "--stop", stop], 2,
                  ("--stop", why))
                 for stop, why in (("\\xZZ", "\\x needs two hex digits"), ("\\x4", "\\x needs two hex digits"),
                                   ("a\\", "a backslash at the end"), ("", "empty stop string"),
                                   ("\\q", "unknown escape \\q"), ("\\x00", "NUL byte"),
                                   ("ab\\", "a backslash at the end"))]


@pytest.fixture(scope="module")
def good_ini(workdir):
    return write_config(os.path.join(workdir, "good.ini"), tiny_config(os.path.join(workdir, "run")))


@pytest.mark.parametrize("case,name,text,args,code,needles", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_config_error(momfmm, workdir, good_ini, case, name, text, args, code, needles):
    paths = {GOOD: good_ini, NOPE: os.path.join(workdir, "nope.ini")}
    if name:
        paths[INI] = os.path.join(workdir, name)
        with open(paths[INI], "w") as f:
            f.write(text)
    ok, detail = expected_failure(run([momfmm] + [paths.get(x, x) for x in args]), code, needles)
    assert ok, f"{case}: {detail}"


def test_file_errors(momfmm, workdir, report, good_ini):
    work = workdir
    ck = os.path.join(work, "ck.h5")
    r = run([momfmm, "init", good_ini, "--out", ck])
    report.check("init writes a checkpoint", r.returncode == 0 and os.path.exists(ck), r.stderr)
    tok = write_tokens(os.path.join(work, "tok.h5"), np.ones((2, 16)), np.ones((2, 16)))
    r = run([momfmm, "loss", ck, tok])
    report.check("loss on good files", r.returncode == 0 and r.stdout.startswith("loss "), r.stdout + r.stderr)

    def variant(name, edit):
        path = os.path.join(work, name)
        shutil.copy(ck, path)
        with h5py.File(path, "r+") as f:
            edit(f)
        return path

    def check_file(name, path, *needles, tokens=tok):
        before = digest(path)
        expect(report, name, run([momfmm, "loss", path, tokens]), 3, *needles)
        report.check(name + ": file untouched", digest(path) == before)

    expect(report, "missing checkpoint", run([momfmm, "loss", os.path.join(work, "none.h5"), tok]), 3, "none.h5")
    empty = os.path.join(work, "empty.h5")
    open(empty, "w").close()
    check_file("empty checkpoint", empty, "empty.h5")
    text = os.path.join(work, "text.h5")
    with open(text, "w") as f:
        f.write("not hdf5\n")
    check_file("not an HDF5 file", text, "text.h5", "HDF5")
    trunc = os.path.join(work, "trunc.h5")
    with open(ck, "rb") as f:
        data = f.read()
    with open(trunc, "wb") as f:
        f.write(data[: len(data) // 2])
    check_file("truncated checkpoint", trunc, "trunc.h5")
    check_file("wrong format", variant("fmt.h5", lambda f: f.attrs.__setitem__("format", "other")), "fmt.h5", "format")
    check_file("newer format_version", variant("ver.h5", lambda f: f.attrs.__setitem__("format_version", 99)),
               "ver.h5", "format_version")
    check_file("missing dataset", variant("miss.h5", lambda f: f.__delitem__("model/blocks/1/mlp/fc/bias")),
               "miss.h5", "/model/blocks/1/mlp/fc/bias")

    def reshape(f):
        del f["model/ln_f/weight"]
        f["model/ln_f/weight"] = np.ones(31, dtype=np.float32)
    check_file("wrong shape", variant("shape.h5", reshape), "shape.h5", "/model/ln_f/weight", "[31]", "[32]")

    def bad_config(f):
        f.attrs["config_ini"] = f.attrs["config_ini"].replace("n_heads = 4", "n_heads = 5")
    check_file("config inconsistent", variant("cfg.h5", bad_config), "cfg.h5", "n_heads")

    notok = write_tokens(os.path.join(work, "range.h5"), np.full((2, 16), 99), np.ones((2, 16)))
    check_file("token out of vocabulary", ck, "range.h5", "/inputs", tokens=notok)
    missing = os.path.join(work, "notargets.h5")
    with h5py.File(missing, "w") as f:
        f["inputs"] = np.ones((2, 16), dtype=np.int32)
    check_file("token file without /targets", ck, "notargets.h5", "/targets", tokens=missing)
    long_tok = write_tokens(os.path.join(work, "long.h5"), np.ones((1, 64)), np.ones((1, 64)))
    check_file("token file longer than the model", ck, "long.h5", "T = 64", tokens=long_tok)
    # it printed "loss 0"
    uncounted = write_tokens(os.path.join(work, "uncounted.h5"), np.ones((2, 16)), np.full((2, 16), -1))
    check_file("token file counting no target", ck, "uncounted.h5", "/targets counts no position", tokens=uncounted)


def test_run_directory_and_metrics_file(momfmm, workdir, report):
    """`inspect metrics.h5` shows the run's latest rows (it used to say
    "cannot open checkpoint as HDF5 (corrupt?)"); `inspect RUN_DIR` and `eval
    RUN_DIR` read the newest checkpoint that loads and name it; a directory
    without one exits 3; floats print in their shortest form; the memory
    line belongs to train alone, after the start-up line."""
    run_dir = os.path.join(workdir, "rundir")
    ini = write_config(os.path.join(workdir, "rundir.ini"),
                       tiny_config(run_dir, **{"train.steps": 4, "train.ckpt_interval": 2, "train.keep": 3,
                                               "momentum.gamma": 0.2}))
    r = run([momfmm, "train", ini])
    report.check("train the run", r.returncode == 0, r.stderr)
    lines = r.stdout.splitlines()
    order = [next((i for i, l in enumerate(lines) if l.startswith(p)), -1) for p in ("momfmm: 1 rank", "memory:")]
    report.check("start-up line before the memory line", 0 <= order[0] < order[1], r.stdout)

    metrics = os.path.join(run_dir, "metrics.h5")
    r = run([momfmm, "inspect", metrics])
    report.check("inspect metrics.h5: its latest rows, not 'corrupt'",
                 r.returncode == 0 and "corrupt" not in r.stderr and "train metrics (4 rows)" in r.stdout
                 and "step 4 loss" in r.stdout, r.stdout + r.stderr)

    newest = os.path.join(run_dir, "ckpt_00000004.h5")
    for command in ("inspect", "eval"):
        r = run([momfmm, command, run_dir])
        report.check(f"{command} RUN_DIR names its newest checkpoint",
                     r.returncode == 0 and r.stdout.startswith(f"checkpoint: {newest}\n"), r.stdout + r.stderr)
        report.check(f"{command}: no memory line", "memory:" not in r.stdout, r.stdout)
    r = run([momfmm, "inspect", run_dir])
    report.check("inspect: gamma in shortest form", "\ngamma = 0.2\n" in r.stdout
                 and "0.20000000000000001" not in r.stdout, r.stdout)

    with open(newest, "r+b") as f:  # the newest no longer loads: the one before it is used
        f.truncate(100)
    r = run([momfmm, "inspect", run_dir])
    report.check("inspect RUN_DIR skips a checkpoint that does not load",
                 r.returncode == 0 and "skipping checkpoint" in r.stdout
                 and f"checkpoint: {os.path.join(run_dir, 'ckpt_00000002.h5')}\n" in r.stdout, r.stdout + r.stderr)

    # a damaged metrics.h5 names its problem (it said "missing root attribute 'format'"), and a file
    # of neither kind both marks missing
    damaged = os.path.join(workdir, "damaged_metrics.h5")
    shutil.copy(metrics, damaged)
    with h5py.File(damaged, "a") as f:
        del f["metrics/train/loss"]
    expect(report, "inspect of a damaged metrics.h5", run([momfmm, "inspect", damaged]), 3,
           "damaged_metrics.h5: ", "/metrics/train/loss")
    with h5py.File(damaged, "a") as f:
        del f["metrics"]
    expect(report, "inspect of a metrics.h5 without /metrics", run([momfmm, "inspect", damaged]), 3,
           "damaged_metrics.h5: no /metrics group")
    with h5py.File(damaged, "a") as f:
        del f.attrs["config_ini"]
    expect(report, "inspect of a file of neither kind", run([momfmm, "inspect", damaged]), 3,
           "damaged_metrics.h5: neither a checkpoint (no root attribute 'format') nor a metrics file (no root "
           "attribute 'config_ini' and no /metrics group)")

    empty = os.path.join(workdir, "empty_run")
    os.makedirs(empty, exist_ok=True)
    shutil.copy(metrics, empty)
    for command in ("inspect", "eval"):
        r = run([momfmm, command, empty])
        expect(report, f"{command} of a run directory without checkpoints", r, 3, "empty_run",
               "no checkpoint", "empty_run/metrics.h5")

    # resume messages print config numbers in their shortest form too
    r = run([momfmm, "train", ini, "--set", "train.lr=0.1", "--set", "train.steps=6", "--resume", "auto"])
    report.check("resume warning in shortest form", r.returncode == 0 and "train.lr: 0.003 vs 0.1" in r.stdout
                 and f"resumed from {os.path.join(run_dir, 'ckpt_00000002.h5')}" in r.stdout, r.stdout + r.stderr)


@pytest.fixture(scope="module")
def kinds(momfmm, workdir):
    return make_kinds(momfmm, os.path.join(workdir, "kinds"))


def test_another_kind_of_file(momfmm, workdir, kinds, report):
    """Every reader of an HDF5 file, given each other kind of momfmm's files, names the file for what
    it is (it named the first thing the reader missed: "missing root attribute 'format'", "missing
    dataset /inputs"); inspect, which reads two kinds, says neither; a config or a tokenizer given
    an HDF5 file, and a checkpoint reader given a text or empty file, say so."""
    ini, files = kinds
    ck, out = files["checkpoint"], os.path.join(workdir, "kinds", "out")
    text_ini = write_config(os.path.join(workdir, "kinds", "text.ini"),
                            tiny_config(out, **{"data.task": "text", "model.vocab_size": 256}))
    readers = [  # (reader, the kind it reads, its command line around the file X)
        ("loss CKPT", "checkpoint", lambda x: ["loss", x, files["loss_tokens"]]),
        ("loss TOKENS", "loss_tokens", lambda x: ["loss", ck, x]),
        ("eval", "checkpoint", lambda x: ["eval", x]),
        ("generate", "checkpoint", lambda x: ["generate", x, "--prompt", "1"]),
        ("logits CKPT", "checkpoint", lambda x: ["logits", x, files["tokens"], "--out", out + ".h5"]),
        ("logits TOKENS", "tokens", lambda x: ["logits", ck, x, "--out", out + ".h5"]),
        ("train --init", "checkpoint", lambda x: ["train", ini, "--init", x, "--set", f"train.out_dir={out}"]),
        ("train --resume", "checkpoint", lambda x: ["train", ini, "--resume", x, "--set", f"train.out_dir={out}"]),
        ("data.path", "tokens", lambda x: ["train", text_ini, "--set", f"data.path={x}"]),
    ]
    for reader, wanted, args in readers:
        for kind, path in files.items():
            if kind != wanted:
                expect(report, f"{reader} given {kind}", run([momfmm] + args(path)), 3,
                       f"{path}: {KIND_NAMES[kind]}, not {KIND_NAMES[wanted]}")
    for kind in ("grads", "logits", "loss_tokens", "tokens"):
        expect(report, f"inspect given {kind}", run([momfmm, "inspect", files[kind]]), 3,
               f"{files[kind]}: {KIND_NAMES[kind]}, neither a checkpoint nor a metrics file")
    for kind, path in files.items():
        expect(report, f"train given {kind} as its config", run([momfmm, "train", path]), 2,
               f"{path}: an HDF5 file, not a config (INI text)")
    for command in (["init", "--out", out + ".h5"], ["bench"], ["data"]):
        expect(report, f"{command[0]} given a checkpoint as its config", run([momfmm, command[0], ck] + command[1:]),
               2, f"{ck}: an HDF5 file, not a config (INI text)")
    expect(report, "data.tokenizer given a checkpoint",
           run([momfmm, "train", text_ini, "--set", f"data.path={text_ini}", "--set", f"data.tokenizer={ck}"]), 3,
           "data.tokenizer = ", ": not a sentencepiece model (momfmm-tokenize train): an HDF5 file")
    empty = os.path.join(workdir, "kinds", "empty.h5")
    open(empty, "w").close()
    for path, what in ((ini, "a text file"), (empty, "an empty file")):
        expect(report, f"eval given {what}", run([momfmm, "eval", path]), 3, f"{path}: {what}, not an HDF5 file")


def test_another_kind_of_file_in_python(kinds, report):
    """The Python reader (momfmm.h5) names the kinds as the binary does."""
    from momfmm import h5
    from momfmm.files import RunError
    _, files = kinds
    readers = [("load_checkpoint", "checkpoint", h5.load_checkpoint), ("load_tokens", "loss_tokens", h5.load_tokens),
               ("read_metrics_file", "metrics", h5.read_metrics_file)]
    for reader, wanted, read in readers:
        for kind, path in files.items():
            if kind == wanted:
                continue
            try:
                read(path)
                report.check(f"{reader} given {kind}", False, "read without an error")
            except RunError as exc:
                want = f"{path}: {KIND_NAMES[kind]}, not {KIND_NAMES[wanted]}"
                report.check(f"{reader} given {kind}", str(exc) == want, f"{exc} (want {want})")
