"""Hostile inputs besides checkpoints (docs/files.md §4), each a named check with its exit code,
the object named and a time bound: file kinds (every reader given a FIFO, a socket, a directory
or a device in place of its file), every file a command writes with a symbolic link (or a FIFO)
under its name, and data files: a relative data.path read from another directory, more
documents than vm.max_map_count, a ListOps TSV with a byte-order mark. Hostile checkpoints:
test_fuzz_files.py."""
import os
import shutil
import signal
import subprocess

import h5py
import numpy as np

from common import env, run
from fuzz_common import TEXT, TIMEOUT_S, base, refused, timed  # noqa: F401 (base: a fixture)


# ---- file kinds (docs/files.md §4): what momfmm reads must be a regular file, and
# nothing it writes goes through a symbolic link or onto a special file ----

def special_kinds(d):
    """{kind: path}: a FIFO without a writer, a bound unix socket, a directory, a device."""
    import socket
    fifo, sock = os.path.join(d, "kind_fifo"), os.path.join(d, "kind_sock")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    if os.path.exists(sock):
        os.unlink(sock)
    s = socket.socket(socket.AF_UNIX)
    s.bind(sock)
    special_kinds.keep = s  # bound for the test's life
    os.makedirs(os.path.join(d, "kind_dir"), exist_ok=True)
    return {"a FIFO": fifo, "a socket": sock, "a directory": os.path.join(d, "kind_dir"),
            "a character device": "/dev/null"}


def test_file_kinds_on_read(momfmm, base, report):
    """Every file read, by every reader, with every kind of thing in its place: one line
    naming the kind, the documented code, within seconds (a FIFO would block an open)."""
    d, ini, ck, tok = base
    out = os.path.join(d, "kinds_run")
    readers = [("the config of init", lambda p: ["init", p, "--out", os.path.join(d, "never.h5")], 2, True),
               ("the checkpoint of inspect", lambda p: ["inspect", p], 3, False),
               ("the checkpoint of eval", lambda p: ["eval", p], 3, False),
               ("the checkpoint of generate", lambda p: ["generate", p, "--prompt", "1"], 3, False),
               ("the token file of loss", lambda p: ["loss", ck, p], 3, True),
               ("the token file of logits", lambda p: ["logits", ck, p, "--out", os.path.join(d, "never2.h5")], 3,
                True),
               ("train --resume PATH", lambda p: ["train", ini, "--set", f"train.out_dir={out}", "--resume", p], 3,
                True),
               ("train --init", lambda p: ["train", ini, "--set", f"train.out_dir={out}", "--init", p], 3, True)]
    for kind, path in special_kinds(d).items():
        for what, args, code, takes_directory in readers:
            if kind == "a directory" and not takes_directory:
                continue  # a directory there is a run directory (docs/cli.md §5)
            r, seconds = timed(momfmm, args(path), timeout=30)
            refused(report, f"{what} is {kind}: exit {code}", r, seconds, code, f"not a regular file but {kind}",
                    within=10)


def test_written_files_never_through_links(momfmm, base, report):
    """Every file a command writes, with a symbolic link (or a FIFO) under its name: the
    write is refused with one line, the link's target keeps its bytes (docs/files.md §4)."""
    d, ini, ck, tok = base
    target = os.path.join(d, "precious")

    def link(at):
        with open(target, "wb") as f:
            f.write(b"precious bytes")
        if os.path.lexists(at):
            os.unlink(at)
        os.symlink(target, at)
        return at

    def untouched():
        with open(target, "rb") as f:
            return f.read() == b"precious bytes"

    tokens = os.path.join(d, "kinds_tokens.h5")
    with h5py.File(tokens, "w") as f:
        f["tokens"] = np.arange(8, dtype=np.int32) % 32
    for what, args, at in (("init --out", ["init", ini, "--force", "--out"], "out.h5"),
                           ("loss --grads", ["loss", ck, tok, "--force", "--grads"], "grads.h5"),
                           ("logits --out", ["logits", ck, tokens, "--force", "--out"], "logits.h5")):
        path = link(os.path.join(d, at))
        r, seconds = timed(momfmm, args + [path])
        refused(report, f"{what} a symbolic link, --force: exit 2", r, seconds, 2, "symbolic link")
        report.check(f"{what}: the link's target keeps its bytes", untouched() and os.path.islink(path))

    def run_dir(name, *files):
        out = os.path.join(d, name)
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        return out, [link(os.path.join(out, f)) for f in files]

    sets = ["--set", "train.steps=2", "--set", "train.eval_interval=1"]
    out, _ = run_dir("link_lock", ".lock")
    r, seconds = timed(momfmm, ["train", ini, "--set", f"train.out_dir={out}", *sets])
    refused(report, "train with .lock a symbolic link: exit 2", r, seconds, 2, ".lock", "symbolic link")
    out, _ = run_dir("fifo_lock")
    os.mkfifo(os.path.join(out, ".lock"))
    r, seconds = timed(momfmm, ["train", ini, "--set", f"train.out_dir={out}", *sets])
    refused(report, "train with .lock a FIFO: exit 2 at once, no hang", r, seconds, 2, ".lock", "FIFO", within=10)
    out, _ = run_dir("link_ckpt", "ckpt_00000002.h5")
    r, seconds = timed(momfmm, ["train", ini, "--set", f"train.out_dir={out}", *sets, "--resume", "auto"])
    report.check("train with ckpt_00000002.h5 a symbolic link: that checkpoint is refused, exit 3",
                 r.returncode == 3 and "ckpt_00000002.h5" in r.stderr and "symbolic link" in r.stderr,
                 r.stderr[-400:])
    report.check("  the link's target keeps its bytes", untouched())
    for name, extra, needle in (("metrics.h5", [], "metrics.h5"),
                                ("best.h5", ["--set", "train.keep_best=true"], "best checkpoint not written")):
        out, _ = run_dir("link_" + name.split(".")[0], name)
        r, seconds = timed(momfmm, ["train", ini, "--set", f"train.out_dir={out}", *sets, *extra])
        report.check(f"train with {name} a symbolic link: a warning naming it, exit 0",
                     r.returncode == 0 and needle in r.stderr and "symbolic link" in r.stderr, r.stderr[-400:])
        report.check("  the link's target keeps its bytes", untouched())
    # STOPPED is written at a stop signal: a link put there during the run is not followed
    out, _ = run_dir("link_stopped")
    p = subprocess.Popen([momfmm, "train", ini, "--set", f"train.out_dir={out}", "--set", "train.steps=1000"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env(MOMFMM_TEST_STEP_SLEEP_MS=200))
    for line in p.stdout:
        if line.startswith("step "):
            break
    link(os.path.join(out, "STOPPED"))
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    report.check("a stop with STOPPED a symbolic link: the checkpoint is written, a warning, exit 0",
                 p.returncode == 0 and "STOPPED" in err and "symbolic link" in err, err[-400:])
    report.check("  the link's target keeps its bytes", untouched())


def eval_loss(stdout):
    line = next((l for l in stdout.splitlines() if l.startswith("eval |")), "")
    return line.split("|")[1].strip() if line else None


def test_relative_data_path(momfmm, workdir, report):
    """A relative data.path is recorded absolute (data.resolved_path): `eval RUN` from another
    directory, or --resume auto there, reads the run's corpus, not another of the same name."""
    d = os.path.join(workdir, "relpath")
    a, b = os.path.join(d, "a"), os.path.join(d, "b")
    for where, seed in ((a, 1), (b, 2)):
        os.makedirs(where, exist_ok=True)
        rng = np.random.default_rng(seed)
        with open(os.path.join(where, "corpus ;x.txt"), "wb") as f:  # ' ;' in the name: escaped in config_ini
            f.write(bytes(rng.integers(97, 123 if seed == 1 else 100, 4000).astype(np.uint8)))
    out = os.path.join(d, "run")
    ini = os.path.join(d, "text.ini")
    with open(ini, "w") as f:
        f.write(TEXT.format(path='"corpus ;x.txt"', out=out))
    r = run([momfmm, "train", ini], timeout=TIMEOUT_S, cwd=a)
    report.check("train in a/ on the relative corpus path", r.returncode == 0, r.stderr[-300:])
    here = eval_loss(run([momfmm, "eval", out], timeout=TIMEOUT_S, cwd=a).stdout)
    there = run([momfmm, "eval", out], timeout=TIMEOUT_S, cwd=b)
    report.check("eval RUN from b/ (another corpus of the same name) scores a/'s corpus",
                 there.returncode == 0 and here is not None and eval_loss(there.stdout) == here,
                 f"{here} vs {eval_loss(there.stdout)} {there.stderr[-200:]}")
    r = run([momfmm, "inspect", out], timeout=TIMEOUT_S, cwd=b)
    want = 'resolved_path = "' + os.path.join(a, "corpus ;x.txt") + '"'
    report.check("inspect shows data.path as given and data.resolved_path", r.returncode == 0 and
                 'path = "corpus ;x.txt"' in r.stdout and want in r.stdout, r.stdout[-600:])
    r = run([momfmm, "train", ini, "--set", "train.steps=3", "--resume", "auto"], timeout=TIMEOUT_S, cwd=b)
    report.check("--resume auto from b/ refuses: the corpus is another one (exit 3 naming data.resolved_path)",
                 r.returncode == 3 and "data.resolved_path" in r.stderr, r.stderr[-300:])
    r = run([momfmm, "train", ini, "--set", "train.steps=3", "--set", f"data.path={os.path.join(a, 'corpus ;x.txt')}",
             "--resume", "auto"], timeout=TIMEOUT_S, cwd=b)
    report.check("--resume auto with the same corpus spelled absolute resumes (a warning for data.path)",
                 r.returncode == 0 and "resumed from" in r.stdout and "data.path" in r.stdout,
                 (r.stdout + r.stderr)[-300:])


def test_many_documents(momfmm, workdir, report):
    """More documents than vm.max_map_count allows mappings (65530 by default): small files are
    read, not mapped (it failed "cannot map: Cannot allocate memory" naming a random file)."""
    d = os.path.join(workdir, "manydocs")
    docs = os.path.join(d, "docs")
    os.makedirs(docs, exist_ok=True)
    with open("/proc/sys/vm/max_map_count") as f:
        n = int(f.read()) + 500
    for i in range(n):
        with open(os.path.join(docs, f"{i:06d}.txt"), "w") as f:
            f.write(f"document {i}: some text\n")
    ini = os.path.join(d, "text.ini")
    with open(ini, "w") as f:
        f.write(TEXT.format(path=docs, out=os.path.join(d, "run")))
    r, seconds = timed(momfmm, ["train", ini], timeout=300)
    report.check(f"train over {n} documents", r.returncode == 0, f"{seconds:.1f} s: {r.stderr[-300:]}")


def test_listops_tsv_with_bom(momfmm, workdir, report):
    d = os.path.join(workdir, "bom")
    os.makedirs(d, exist_ok=True)
    tsv = os.path.join(d, "listops.tsv")
    rows = [f"[MAX {i % 10} {(i * 7) % 10} ]\t{max(i % 10, (i * 7) % 10)}" for i in range(40)]
    with open(tsv, "w", encoding="utf-8-sig") as f:  # a byte-order mark first, as editors write
        f.write("Source\tTarget\n" + "\n".join(rows) + "\n")
    ini = os.path.join(d, "listops.ini")
    with open(ini, "w") as f:
        f.write("[model]\nvocab_size = 16\nd_model = 32\nn_heads = 4\nn_layers = 1\nd_ff = 64\nhead = cls\n"
                f"[data]\ntask = listops\nseq_len = 16\npath = {tsv}\n"
                f"[train]\nsteps = 1\nbatch_size = 4\neval_interval = 0\nout_dir = {os.path.join(d, 'run')}\n")
    r = run([momfmm, "train", ini], timeout=TIMEOUT_S)
    report.check("a ListOps TSV with a byte-order mark trains (its header recognised)", r.returncode == 0,
                 r.stderr[-300:])
