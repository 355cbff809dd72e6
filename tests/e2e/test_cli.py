"""Command line (docs/cli.md §5) and config reader (docs/config.md §6):
--version, help, COMMAND --help; "did you mean" for unknown commands,
options, sections and keys; ranges in messages; duplicate keys; config lines
of any length, and a checkpoint whose config_ini holds one, read back.

Run: MOMFMM_BIN=build/momfmm /usr/bin/python3 -m pytest tests/e2e/test_cli.py
"""
import re

import pytest

from common import run, tiny_config, write_config

COMMANDS = ["train", "init", "loss", "eval", "inspect", "generate", "bench"]
# Each command's options, and the defaults its help must state.
OPTIONS = {
    "train": ["--set", "--resume", "--init"],
    "init": ["--set", "--out"],
    "loss": ["--grads"],
    "eval": ["--stream", "--segment"],
    "inspect": [],
    "generate": ["--prompt", "--text", "--tokens", "--temperature", "--seed", "--top-k", "--top-p", "--stop"],
    "bench": ["--set", "--steps"],
}
DEFAULTS = {"bench": ["--steps N", "(default: 10)"], "eval": ["--segment N", "(default: 1)"],
            "generate": ["--tokens N", "(default: 32)", "(default: 0)"]}
TINY = """[model]
vocab_size = 32
d_model = 32
n_heads = 4
n_layers = 1
d_ff = 64

[data]
seq_len = 16
chain_len = 5

[train]
steps = 2
batch_size = 2
lr = 0.003
out_dir = {out_dir}
"""


def write(path, text):
    path.write_text(text)
    return path


def usage_error(result, *needles):
    """Exit 2, one `momfmm:` message containing every needle, no crash."""
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("momfmm: "), result.stderr
    for needle in needles:
        assert needle in result.stderr, f"{needle!r} not in {result.stderr!r}"
    assert "AddressSanitizer" not in result.stderr and "Segmentation" not in result.stderr


def test_version(momfmm):
    r = run([momfmm, "--version"])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert re.fullmatch(r"momfmm \d+\.\d+\.\d+ \(git \S+\)", lines[0]), lines[0]
    for library in ("MPI", "OpenBLAS", "HDF5"):
        line = next((l for l in lines if l.startswith(library + ":")), "")
        assert "built with" in line and "running" in line, r.stdout
    assert re.search(r"HDF5: +built with \d+\.\d+\.\d+; running \d+\.\d+\.\d+", r.stdout), r.stdout


def test_help_lists_every_command(momfmm):
    for args in (["help"], ["--help"], ["-h"]):
        r = run([momfmm, *args])
        assert r.returncode == 0, r.stderr
        for command in COMMANDS:
            assert re.search(rf"^  {command} ", r.stdout, re.M), (args, r.stdout)


@pytest.mark.parametrize("command", COMMANDS)
def test_command_help(momfmm, command):
    for args in ([command, "--help"], [command, "-h"], ["help", command], [command, "x.ini", "--help"]):
        r = run([momfmm, *args])
        assert r.returncode == 0, (args, r.stderr)
        assert r.stdout.startswith(f"usage: momfmm {command} "), r.stdout
        for option in OPTIONS[command] + ["--help"]:
            assert re.search(rf"^  (-h, )?{option}\b", r.stdout, re.M), (option, r.stdout)
        for needle in DEFAULTS.get(command, []):
            assert needle in r.stdout, (needle, r.stdout)


def test_unknown_command_and_option(momfmm, tmp_path):
    usage_error(run([momfmm, "trian"]), "unknown command 'trian'", "did you mean train?")
    usage_error(run([momfmm, "help", "trian"]), "did you mean train?")
    usage_error(run([momfmm, "fly"]), "unknown command 'fly'")
    ini = write(tmp_path / "tiny.ini", TINY.format(out_dir=tmp_path / "run"))
    usage_error(run([momfmm, "bench", ini, "--step", "3"]), "unknown option --step", "did you mean --steps?")
    usage_error(run([momfmm, "init", ini, "-o", "x.h5"]), "unknown option -o", "did you mean --out?")
    usage_error(run([momfmm, "generate", "x.h5", "--steps", "3"]), "--steps is not accepted", "bench")
    usage_error(run([momfmm, "bench", ini, "--steps", "0"]), "--steps 0", "[1, 1073741824]")


@pytest.mark.parametrize("section, line, suggestion", [
    ("train", "lrr = 1", "unknown key train.lrr; did you mean train.lr?"),
    ("train", "learning_rate = 1", "unknown key train.learning_rate; did you mean train.lr?"),
    ("model", "n_head = 2", "unknown key model.n_head; did you mean model.n_heads?"),
    ("momentum", "gama = 0.5", "unknown key momentum.gama; did you mean momentum.gamma?"),
    ("trian", "lr = 1", "unknown section [trian] (key lr); did you mean train.lr?"),
    ("data", "task = chian", "data.task = 'chian': not one of the allowed values (allowed: chain|copy|listops|text); "
                             "did you mean chain?"),
])
def test_unknown_key_suggestions(momfmm, tmp_path, section, line, suggestion):
    ini = write(tmp_path / "bad.ini", f"[{section}]\n{line}\n")
    usage_error(run([momfmm, "train", ini]), "bad.ini:2: " + suggestion)


def test_set_suggestions_and_ranges(momfmm, tmp_path):
    ini = write(tmp_path / "tiny.ini", TINY.format(out_dir=tmp_path / "run"))
    out = tmp_path / "x.h5"
    usage_error(run([momfmm, "init", ini, "--out", out, "--set", "train.lrr=1"]), "did you mean train.lr?")
    usage_error(run([momfmm, "init", ini, "--out", out, "--set", "learning_rate=1"]), "did you mean train.lr=1?")
    usage_error(run([momfmm, "init", ini, "--out", out, "--set", "train.steps=-5"]),
                "train.steps = -5 is out of range: must be in [0, 9007199254740992]")
    usage_error(run([momfmm, "init", ini, "--out", out, "--set", "model.n_heads=0"]),
                "model.n_heads = 0 is out of range: must be in [1, 4096]")
    usage_error(run([momfmm, "init", ini, "--out", out, "--set", "model.n_classes=1"]), "model.n_classes")
    assert not out.exists()



@pytest.mark.parametrize("command", ["train", "init", "bench", "data"])
def test_clash_names_the_set(momfmm, tmp_path, command):
    """A check of keys against each other names the file alone when the file
    holds both values, and the file "with --set" when a --set gave one: the
    file's n_heads is 4, so a message naming only the file would send the
    reader to a value it does not hold. Walks every command that reads a
    config with --set, and the checks of each kind (model, lr, chain)."""
    ini = write(tmp_path / "tiny.ini", TINY.format(out_dir=tmp_path / "run"))
    extra = {"init": ["--out", str(tmp_path / "x.h5")]}.get(command, [])
    clashes = [("model.n_heads=3", "model.d_model = 32 is not divisible by model.n_heads = 3"),
               ("train.min_lr=1", "train.min_lr = 1 exceeds train.lr = 0.003"),
               ("data.chain_len_max=4", "data.chain_len_max = 4 is below data.chain_len = 5")]
    for assignment, message in clashes:
        usage_error(run([momfmm, command, ini, *extra, "--set", assignment]), f"tiny.ini with --set: {message}")
        key, value = assignment.split("=")
        section, name = key.split(".")
        text = TINY.format(out_dir=tmp_path / "run")
        line = f"{name} = {value}\n"
        text, changed = re.subn(rf"^{name} = .*\n", line, text, flags=re.M)
        held = write(tmp_path / "held.ini", text if changed else text.replace(f"[{section}]\n", f"[{section}]\n{line}"))
        usage_error(run([momfmm, command, held, *extra]), f"held.ini: {message}")
    assert not (tmp_path / "x.h5").exists() and not (tmp_path / "run").exists()


def test_options_that_cannot_act(momfmm, tmp_path):
    """An option that acts only beside another, given without it, exits 2
    naming both before any file is read (the inputs here do not exist); its
    default passes, and beside its partner it runs (docs/cli.md §5)."""
    missing = str(tmp_path / "missing.h5")
    sampling = "acts only when sampling"
    for args, needle in [
            (["eval", missing, "--segment", "4"], "eval: --segment acts only with --stream"),
            (["generate", missing, "--prompt", "1", "--top-k", "5"], f"generate: --top-k {sampling}"),
            (["generate", missing, "--prompt", "1", "--top-p", "0.5"], f"generate: --top-p {sampling}"),
            (["generate", missing, "--prompt", "1", "--seed", "7", "--temperature", "0"],
             f"generate: --seed {sampling}"),
            (["train", missing, "--overwrite", "--resume", "auto"], "train: --overwrite acts only without --resume"),
            (["loss", missing, missing, "--force"], "loss: --force acts only with an output file to replace")]:
        usage_error(run([momfmm, *args]), needle)
    ini = write(tmp_path / "tiny.ini", TINY.format(out_dir=tmp_path / "run"))
    ckpt = tmp_path / "init.h5"
    assert run([momfmm, "init", ini, "--out", ckpt]).returncode == 0
    generate = ["generate", ckpt, "--prompt", "1", "--tokens", "2"]
    for args in ([*generate, "--temperature", "0", "--seed", "0", "--top-k", "0", "--top-p", "1"],
                 [*generate, "--temperature", "0.5", "--seed", "7", "--top-k", "5", "--top-p", "0.5"],
                 ["eval", ckpt, "--segment", "1"],
                 ["eval", ckpt, "--stream", "--segment", "4"]):
        r = run([momfmm, *args])
        assert r.returncode == 0, (args, r.stderr)
    assert not (tmp_path / "run").exists()


def test_duplicates(momfmm, tmp_path):
    ini = write(tmp_path / "dup.ini", TINY.format(out_dir=tmp_path / "run") + "lr = 0.1\n")
    line = TINY.count("\n") + 1
    first = TINY.splitlines().index("lr = 0.003") + 1
    usage_error(run([momfmm, "init", ini, "--out", tmp_path / "x.h5"]),
                f"dup.ini:{line}: duplicate key train.lr (first set at line {first})")
    ini = write(tmp_path / "dupsec.ini", TINY.format(out_dir=tmp_path / "run") + "[model]\n")
    usage_error(run([momfmm, "init", ini, "--out", tmp_path / "x.h5"]), "duplicate section [model] (first at line 1)")


def inspect_config(momfmm, ckpt):
    r = run([momfmm, "inspect", ckpt])
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_long_lines_end_to_end(momfmm, tmp_path):
    """A 10k-character comment ending in `lr = 1000000` stays a comment; a
    long value is read whole; numbers come back in their shortest form."""
    out_dir = str(tmp_path / ("d" * 200) / ("e" * 200) / ("f" * 200))
    text = TINY.format(out_dir=out_dir).replace("[train]\n", "[train]\n; " + "x" * 10000 + " lr = 1000000\n")
    text = text.replace("[model]\n", "[model]\n" + " " * 5000 + "n_layers = 2 " + " " * 5000 + "; " + "y" * 5000 + "\n")
    text = text.replace("n_layers = 1\n", "")
    ini = write(tmp_path / "long.ini", text)
    ckpt = tmp_path / "long.h5"
    r = run([momfmm, "init", ini, "--out", ckpt])
    assert r.returncode == 0, r.stderr
    shown = inspect_config(momfmm, ckpt)
    assert re.search(r"^lr = 0\.003$", shown, re.M), shown
    assert re.search(r"^n_layers = 2$", shown, re.M), shown
    assert f"out_dir = {out_dir}\n" in shown
    assert "1000000" not in shown and "0.0030000000000000001" not in shown


def test_checkpoint_with_long_out_dir(momfmm, tmp_path):
    """A 300-byte out_dir in config_ini (past the old 200-byte line buffer)."""
    out_dir = "/" + "/".join(["p" * 99] * 3)
    assert len(out_dir) == 300
    ini = write(tmp_path / "dir.ini", TINY.format(out_dir=out_dir))
    ckpt = tmp_path / "dir.h5"
    r = run([momfmm, "init", ini, "--out", ckpt])
    assert r.returncode == 0, r.stderr
    assert f"out_dir = {out_dir}\n" in inspect_config(momfmm, ckpt)
    r = run([momfmm, "eval", ckpt])
    assert r.returncode == 0, r.stderr


def test_help_exit_codes_and_rank_counts(momfmm, tmp_path, report):
    """`momfmm help` lists every exit code of docs/cli.md §5 (0-4), and the
    messages that count ranks and threads say "1 rank x 1 thread", not
    "1 ranks x 1 threads" (start-up line, bench)."""
    r = run([momfmm, "help"])
    line = " ".join(l for l in r.stdout.splitlines() if "exit codes" in l or l.startswith("4 "))
    codes = re.findall(r"\b([0-4]) [a-z]", r.stdout.split("exit codes:", 1)[-1])
    report.check("help: lists exit codes 0, 1, 2, 3 and 4", r.returncode == 0 and codes[:5] == list("01234"),
                 f"{codes} in {line!r}")
    report.check("help: lists exit code 130 (a second Ctrl-C)", "130 train ended at once" in r.stdout, r.stdout[-300:])
    ini = write_config(str(tmp_path / "bench.ini"), tiny_config(str(tmp_path / "run")))
    b = run([momfmm, "bench", ini, "--steps", "2"])
    said = re.findall(r"\d+ ranks? x \d+ threads?", b.stdout)
    report.check("bench alone: every rank count reads '1 rank x 1 thread'",
                 b.returncode == 0 and len(said) >= 3 and set(said) == {"1 rank x 1 thread"},
                 f"rc {b.returncode}: {said} {b.stderr[-200:]}")
