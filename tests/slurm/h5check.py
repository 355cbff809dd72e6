"""Checkpoint checks of test_slurm.sh, on the end-to-end tests' readers
(momfmm.h5 and tests/e2e/ckpt_util.py), so a Slurm job's checkpoint is judged
by the same comparisons as the checkpoint tests. Prints one line; exits 0 when
the check holds, 1 when it does not or (with a message naming the file) when a
file cannot be read.

  ckpt DIR STEP WORLD NLOG  the newest checkpoint in DIR has step STEP,
                            world_size WORLD and NLOG rows of /metrics/train
  same A B                  B equals A bit for bit: tensors, metrics, step
                            (ckpt_util.bitwise_report)
  close A B TOL             the same step, and every /model, /optim and
                            /buffers dataset of B within TOL of A's:
                            max |a - b| / max |a| (ckpt_util.rel_tensors)
  world FILE                prints the checkpoint's step and world_size
  config DIR REGEX          the newest checkpoint's config_ini matches REGEX

Run with Debian's /usr/bin/python3 (h5py, numpy) and PYTHONPATH=python:tests/e2e (test_slurm.sh
sets it)."""
import os
import re
import sys

from momfmm.h5 import RunError, load_checkpoint, newest_checkpoint
from ckpt_util import bitwise_report, load_state, rel_tensors


def newest(directory):
    path = newest_checkpoint(directory) if os.path.isdir(directory) else None
    if path is None:
        raise RunError(f"{directory}: no ckpt_<step>.h5")
    return path


def check_ckpt(directory, step, world, nlog):
    path = newest(directory)
    ck = load_checkpoint(path, optim=False)
    got = (ck.step, int(ck.attrs["world_size"]), len(ck.train.get("loss", ())))
    print(f"{os.path.basename(path)}: step {got[0]}, world_size {got[1]}, {got[2]} train-log rows, "
          f"{len(ck.params)} /model datasets")
    return got == (int(step), int(world), int(nlog)) and len(ck.params) > 0


def check_same(a, b):
    ok, detail = bitwise_report(a, b)
    print(detail)
    return ok


def check_close(a, b, tol):
    (sa, aa), (sb, ab) = load_state(a), load_state(b)
    out, ok = [], int(aa["step"]) == int(ab["step"])
    if not ok:
        out.append(f"steps differ ({aa['step']} vs {ab['step']})")
    for group in ("model", "optim"):
        if not any(k.startswith(group + "/") for k in sa):
            raise RunError(f"{a}: no /{group} datasets")
    tensors = ("model", "optim", "buffers")
    worst, where = rel_tensors(sa, sb, tensors)
    in_a, in_b = ({k for k in s if k.split("/")[0] in tensors} for s in (sa, sb))
    if in_b - in_a:  # rel_tensors walks A's datasets only
        worst, where = float("inf"), f"{min(in_b - in_a)} only in {b}"
    out.append(f"{len(in_a)} datasets, max rel diff {worst:.2e}" + (f" ({where})" if where else ""))
    print("; ".join(out))
    return ok and worst <= float(tol)


def check_config(directory, pattern):
    text = load_checkpoint(newest(directory), optim=False, metrics=False).attrs.get("config_ini", "")
    return re.search(pattern, str(text), re.M) is not None


def print_world(path):
    attrs = load_checkpoint(path, optim=False, metrics=False).attrs
    print(int(attrs["step"]), int(attrs["world_size"]))
    return True


COMMANDS = {"ckpt": (check_ckpt, 4), "same": (check_same, 2), "close": (check_close, 3),
            "world": (print_world, 1), "config": (check_config, 2)}


def main(argv):
    if not argv or argv[0] not in COMMANDS or len(argv) - 1 != COMMANDS[argv[0]][1]:
        sys.exit(__doc__)
    check, _ = COMMANDS[argv[0]]
    try:
        return 0 if check(*argv[1:]) else 1
    except (RunError, KeyError, ValueError) as exc:
        sys.exit(f"h5check {argv[0]}: {exc}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
