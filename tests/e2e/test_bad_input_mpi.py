"""Bad input under mpirun (docs/cli.md §5, under mpirun): a file refused on any rank ends the
job in one line and its exit code, no MPI_Abort banner, also when the file fails on one rank
alone. Apart from test_bad_input so that CTest runs the two side by side (this one mostly waits
for mpirun to start)."""
import os
import shutil
import subprocess

import pytest

from ckpt_util import LAUNCHER
from common import run, tiny_config, write_config
from file_kinds import KIND_NAMES, make_kinds


def mount_namespaces():
    """Whether this process may make a mount namespace and mount a tmpfs in it (root with
    CAP_SYS_ADMIN: the case of a file missing on one node needs it)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs none /mnt"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def kinds(momfmm, workdir):
    return make_kinds(momfmm, os.path.join(workdir, "kinds"))


def test_file_refusals_under_mpirun(momfmm, workdir, kinds, report):
    """Under the launcher with two ranks, a refused input or output file of eval, inspect, loss and
    logits (generate and logits read their checkpoint as eval does) ends the job in one line and
    its exit code (it ended in MPI_Abort's banner, each rank printing the line), also when the file fails on one rank alone (dist_agree_status,
    docs/cli.md §5 under mpirun): here rank 1 is given another file than rank 0, as a node-local
    path may differ. Train's own files too (config, --resume, --init, data.path), which failed on
    one rank alone without a word and left the others to dist.timeout (exit 5)."""
    ini, files = kinds
    ck, out = files["checkpoint"], os.path.join(workdir, "kinds", "mpi_out.h5")
    env = dict(os.environ, OMP_NUM_THREADS="1")

    def on_rank_1(args, path_1, path_0):
        """`momfmm ARGS FILE` with FILE path_1 on rank 1 and path_0 on the others."""
        pick = f'"$([ "$OMPI_COMM_WORLD_RANK" = 1 ] && echo {path_1} || echo {path_0})"'
        return ["sh", "-c", f"exec {momfmm} {' '.join(args)} {pick}"]

    cases = [  # (case, command, exit code, the one line after "momfmm: ")
        ("eval of a metrics file", [momfmm, "eval", files["metrics"]], 3,
         f"{files['metrics']}: {KIND_NAMES['metrics']}, not {KIND_NAMES['checkpoint']}"),
        ("inspect of a token file", [momfmm, "inspect", files["tokens"]], 3,
         f"{files['tokens']}: {KIND_NAMES['tokens']}, neither a checkpoint nor a metrics file"),
        ("loss of a token file of ids", [momfmm, "loss", ck, files["tokens"]], 3,
         f"{files['tokens']}: {KIND_NAMES['tokens']}, not {KIND_NAMES['loss_tokens']}"),
        ("loss --grads in a missing directory",
         [momfmm, "loss", ck, files["loss_tokens"], "--grads", os.path.join(workdir, "nodir", "g.h5")], 2,
         f"--grads {os.path.join(workdir, 'nodir', 'g.h5')}: its directory {os.path.join(workdir, 'nodir')}: "
         "does not exist (create it first)"),
        ("eval, a gradient file on rank 1 alone", on_rank_1(["eval"], files["grads"], ck), 3,
         f"{files['grads']}: {KIND_NAMES['grads']}, not {KIND_NAMES['checkpoint']}"),
        ("logits, a loss token file on rank 1 alone",
         on_rank_1(["logits", ck, "--out", out], files["loss_tokens"], files["tokens"]), 3,
         f"{files['loss_tokens']}: {KIND_NAMES['loss_tokens']}, not {KIND_NAMES['tokens']}"),
        ("train --resume, a metrics file on rank 1 alone",
         on_rank_1(["train", ini, "--set", f"train.out_dir={out}.run", "--set", "dist.timeout=60", "--resume"],
                   files["metrics"], ck), 3,
         f"{files['metrics']}: {KIND_NAMES['metrics']}, not {KIND_NAMES['checkpoint']}"),
        ("train --init, a token file on rank 1 alone",
         on_rank_1(["train", ini, "--set", f"train.out_dir={out}.run", "--set", "dist.timeout=60", "--init"],
                   files["tokens"], ck), 3,
         f"--init {files['tokens']}: {KIND_NAMES['tokens']}, not {KIND_NAMES['checkpoint']}"),
        ("train, a config missing on rank 1 alone",
         on_rank_1(["train"], ini + ".missing", ini), 2, f"{ini}.missing: cannot open config: No such file or "
                                                          "directory"),
    ]
    if mount_namespaces():
        # a data file missing on one node: rank 1 in a mount namespace with a tmpfs over its directory
        data_dir = os.path.join(workdir, "kinds", "data")
        os.makedirs(data_dir, exist_ok=True)
        corpus = os.path.join(data_dir, "corpus.txt")
        with open(corpus, "w") as f:
            f.write("momentum attention, near field and far field. " * 200)
        text_ini = write_config(os.path.join(workdir, "kinds", "node_local.ini"),
                                tiny_config(out + ".run", **{"data.task": "text", "model.vocab_size": 256,
                                                             "data.path": corpus, "dist.timeout": 60}))
        train = f"{momfmm} train {text_ini}"
        hide = f"unshare -m sh -c 'mount -t tmpfs none {data_dir} && exec {train}'"
        cases.append(("train, data.path missing on rank 1 alone",
                      ["sh", "-c", f'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then exec {hide}; else exec {train}; fi'],
                      3, f"data.path = {corpus}: cannot open: No such file or directory"))
    for case, command, code, line in cases:
        r = run([LAUNCHER, "--oversubscribe", "-np", 2] + command, timeout=120, env=env)
        report.check(f"{case}: exit {code}, one line", r.returncode == code and r.stderr.strip() == f"momfmm: {line}",
                     f"rc {r.returncode}; stderr {r.stderr.strip()[:400]!r}")
    report.check("no output written", not os.path.exists(out))
