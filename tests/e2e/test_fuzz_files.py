"""Later classes (docs/files.md §4, hostile files), each a named check with its exit
code, the object named and a time bound: external and soft links (to a FIFO too),
external raw storage and virtual datasets; filters (gzip'd metric columns declaring
2^25 and 2^31 rows, a gzip'd tensor declaring 2^31 x 32; honest compression still
loads); counters near 2^63 (step, tokens_seen, skipped_steps); checkpoint names past
eight digits (step 10^8) and names outside the rule; NaN/Inf weights and
buffers, NaN and negative AdamW moments; a checkpoint locked by a writer; MPMD
launches whose ranks differ in train.steps, model.d_model, train.lr; escaped strings
(newline, ' ;', '#', quotes in train.out_dir; a NUL inside config_ini); --init with
--overwrite. File kinds, links under written names and data files: test_fuzz_inputs.py.
The config round trip over random strings is tests/test_config.c's property test.

Every hostile checkpoint here also goes to the Python readers (docs/design.md §8.8), which must refuse it
exactly when the binary does: momfmm.pt.load as `eval`, momfmm_report.py as `inspect`,
momfmm.h5.load_checkpoint with /optim as `train --resume` (fuzz_common.verdict_mismatches);
tensors of another model than config_ini names are refused by both."""
import os
import shutil
import subprocess
import time

import re

import h5py
import numpy as np
import pytest

from common import run
from fuzz_common import (COMMANDS, METRICS, SANITIZER_MARKS, TEXT, TIMEOUT_S, base,  # noqa: F401 (base: a fixture)
                         mutated_copy, python_verdicts, refused, replace_dataset, timed, verdict_mismatches)


def python_agrees(report, what, path, binary):
    """A named check: the Python readers refuse `path` exactly when the binary's commands do
    (binary: {command: exit code})."""
    mismatches = verdict_mismatches(what, path, binary)
    report.check(f"{what}: the Python readers agree with momfmm {'/'.join(binary)}", not mismatches,
                 "; ".join(mismatches))


# ---- the classes of docs/files.md §4 added later: links and foreign storage, filters,
# counters near their limits, non-finite values, locks, mismatched ranks, escaped strings ----

def foreign_cases(d):
    """(description, mutate, the object the message must name): data found outside the file."""
    fifo = os.path.join(d, "fifo.h5")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)

    def external_group(f):
        del f["model"]
        f["model"] = h5py.ExternalLink(fifo, "/model")

    def external_tensor(target):
        def mutate(f):
            del f["model/tok_emb"]
            f["model/tok_emb"] = h5py.ExternalLink(target, "/model/tok_emb")
        return mutate

    def soft_tensor(f):
        f.move("model/tok_emb", "model/elsewhere")
        f["model/tok_emb"] = h5py.SoftLink("/model/elsewhere")

    def external_storage(f):
        shape = f["model/tok_emb"].shape
        del f["model/tok_emb"]
        f.create_dataset("model/tok_emb", shape=shape, dtype="f4", external=[(fifo, 0, h5py.h5f.UNLIMITED)])

    def virtual(f):
        shape = f["model/tok_emb"].shape
        layout = h5py.VirtualLayout(shape=shape, dtype="f4")
        layout[:] = h5py.VirtualSource(fifo, "/x", shape=shape)
        del f["model/tok_emb"]
        f.create_virtual_dataset("model/tok_emb", layout)

    def external_metrics(f):
        del f["metrics/train/loss"]
        f["metrics/train/loss"] = h5py.ExternalLink(fifo, "/loss")

    return [("an external link to a FIFO for /model", external_group, "/model is an external link"),
            ("an external link for a tensor", external_tensor(fifo), "/model/tok_emb is an external link"),
            ("a soft link for a tensor", soft_tensor, "/model/tok_emb is a soft link"),
            ("external raw storage in a FIFO", external_storage, "/model/tok_emb keeps its data in external files"),
            ("a virtual dataset over a FIFO", virtual, "/model/tok_emb is a virtual dataset"),
            ("an external link for a metric column" + METRICS, external_metrics,
             "/metrics/train/loss is an external link")]


def test_links_and_foreign_storage(momfmm, base, report):
    d, ini, ck, tok = base
    for i, (what, mutate, needle) in enumerate(foreign_cases(d)):
        bad = os.path.join(d, f"foreign_{i}.h5")
        mutated_copy(ck, bad, mutate)
        commands = [("inspect",)] if what.endswith(METRICS) else [
            *COMMANDS, ("loss", tok), ("train", "--resume")]
        binary = {}
        for cmd in commands:
            if cmd[0] == "train":
                out = os.path.join(d, f"foreign_run_{i}")
                args = ["train", ini, "--set", f"train.out_dir={out}", "--resume", bad]
            else:
                args = [cmd[0], bad, *cmd[1:]]
            r, seconds = timed(momfmm, args)
            binary[cmd[0]] = r.returncode
            refused(report, f"{cmd[0]} on {what}: exit 3 naming it", r, seconds, 3, bad, needle)
        start = time.time()
        python_agrees(report, what, bad, binary)
        report.check(f"{what}: the Python readers answer within 20 s", time.time() - start < 20)
    # --resume auto meets the file under a checkpoint name
    out = os.path.join(d, "foreign_auto")
    os.makedirs(out, exist_ok=True)
    mutated_copy(ck, os.path.join(out, "ckpt_00000009.h5"), foreign_cases(d)[0][1])
    r, seconds = timed(momfmm, ["train", ini, "--set", f"train.out_dir={out}", "--resume", "auto"])
    report.check("--resume auto skips a checkpoint whose /model is an external link, within seconds",
                 r.returncode == 0 and seconds < 30 and "/model is an external link" in r.stdout + r.stderr,
                 f"rc {r.returncode} in {seconds:.1f} s: {(r.stdout + r.stderr)[-300:]!r}")


def test_filters(momfmm, base, report):
    """Compressed datasets are bounded by their declared, decompressed size before any read."""
    d, ini, ck, tok = base

    def compressed_metrics(rows):
        def mutate(f):
            for key in list(f["metrics/train"]):
                del f["metrics/train/" + key]
                f.create_dataset("metrics/train/" + key, shape=(rows,), dtype="i8" if key == "step" else "f8",
                                 chunks=(2**16,), compression="gzip", fillvalue=0)
                f["metrics/train/" + key][:2**16] = 0
        return mutate

    for rows, label in ((2**25, "2^25"), (2**31, "2^31")):
        bad = os.path.join(d, f"zip_{label.replace('^', '')}.h5")
        mutated_copy(ck, bad, compressed_metrics(rows))
        r, seconds = timed(momfmm, ["inspect", bad])
        refused(report, f"inspect: gzip'd metric columns of {label} zero rows refused within 10 s", r, seconds, 3,
                bad, "/metrics/train/step", "compressed", within=10)
        python_agrees(report, f"gzip'd metric columns of {label} rows", bad, {"inspect": r.returncode})
    # honest compression loads: small gzip'd metric columns and a gzip'd tensor
    good = os.path.join(d, "zip_good.h5")

    def recompress(f):
        for group in ("metrics/train", "model"):
            names = []
            f[group].visit(lambda n: names.append(n) if isinstance(f[group][n], h5py.Dataset) else None)
            for name in names[:3]:
                data = f[group][name][()]
                del f[group][name]
                f[group].create_dataset(name, data=data, compression="gzip", shuffle=True)
    mutated_copy(ck, good, recompress)
    r, seconds = timed(momfmm, ["inspect", good])
    report.check("inspect loads gzip'd small columns and tensors", r.returncode == 0, r.stderr[-300:])
    python_agrees(report, "gzip'd small columns and tensors", good, {"inspect": r.returncode, "eval": 0})
    # declared far beyond memory, also through a filter
    huge = os.path.join(d, "zip_tensor.h5")
    mutated_copy(ck, huge, replace_dataset("model/tok_emb", lambda f, p: f.create_dataset(
        p, shape=(2**31, 32), dtype="f4", chunks=(2**14, 32), compression="gzip")))
    r, seconds = timed(momfmm, ["eval", huge])
    refused(report, "eval: a gzip'd tensor declaring 2^31 x 32 refused", r, seconds, 3, huge, "/model/tok_emb")
    python_agrees(report, "a gzip'd tensor declaring 2^31 x 32", huge, {"eval": r.returncode})


def test_counters_near_limits(momfmm, base, report):
    d, ini, ck, tok = base
    big = 2**63 - 1
    r, seconds = timed(momfmm, ["inspect", ck])
    for name, attrs, code, needle in (
            ("skipped_steps = 2^63-1", {"skipped_steps": np.int64(big)}, 3, "skipped_steps = 9223372036854775807"),
            ("step = tokens_seen = 2^63-1", {"step": np.int64(big), "tokens_seen": np.int64(big),
                                             "skipped_steps": np.int64(big)}, 0, "")):
        bad = os.path.join(d, f"limits_{name.split()[0]}.h5")
        mutated_copy(ck, bad, lambda f, attrs=attrs: [f.attrs.__setitem__(k, v) for k, v in attrs.items()])
        binary = {}
        for cmd in (["inspect", bad], ["eval", bad]):
            r, seconds = timed(momfmm, cmd)
            binary[cmd[0]] = r.returncode
            if code:
                refused(report, f"{cmd[0]} with {name}: exit 3", r, seconds, code, needle)
            else:
                report.check(f"{cmd[0]} with {name}: reads", r.returncode == 0 and
                             not any(m in r.stderr for m in SANITIZER_MARKS), r.stderr[-300:])
        python_agrees(report, name, bad, binary)
    # a step column past 2^53 (exact as doubles; train.steps' limit) would overflow where it
    # becomes an integer again: inspect prints it, a resume writes it back
    for value in (2**63 - 1, 2**53 + 2, -1):
        bad = os.path.join(d, f"limits_step_column_{value}.h5")
        mutated_copy(ck, bad, replace_dataset("metrics/train/step", lambda f, p, v=value: f.create_dataset(
            p, data=np.full(f["metrics/train/loss"].shape, v, np.int64))))
        r, seconds = timed(momfmm, ["inspect", bad])
        refused(report, f"inspect with /metrics/train/step = {value}: exit 3", r, seconds, 3, "/metrics/train/step[0]",
                "is not a step")
        python_agrees(report, f"/metrics/train/step = {value}", bad, {"inspect": r.returncode})
    # tokens_seen near 2^63 resumed and trained on: saturates, and the checkpoint written loads
    near = os.path.join(d, "limits_tokens.h5")
    mutated_copy(ck, near, lambda f: f.attrs.__setitem__("tokens_seen", np.int64(big - 10)))
    out = os.path.join(d, "limits_run")
    r, seconds = timed(momfmm, ["train", ini, "--set", f"train.out_dir={out}", "--set", "train.steps=4",
                                "--resume", near])
    report.check("train resumed at tokens_seen 2^63-11: exit 0, no sanitizer report",
                 r.returncode == 0 and not any(m in r.stderr for m in SANITIZER_MARKS), r.stderr[-400:])
    written = os.path.join(out, "ckpt_00000004.h5")
    with h5py.File(written, "r") as f:
        seen = int(f.attrs["tokens_seen"])
    report.check("tokens_seen saturates at 2^63-1", seen == big, str(seen))
    r, seconds = timed(momfmm, ["train", ini, "--set", f"train.out_dir={out}", "--set", "train.steps=5",
                                "--resume", "auto"])
    report.check("the checkpoint with a saturated tokens_seen resumes", r.returncode == 0 and
                 "resumed from" in r.stdout and "ckpt_00000004.h5" in r.stdout, r.stderr[-300:])


def test_checkpoint_names_past_eight_digits(momfmm, base, report):
    """docs/files.md §4, checkpoint names: ckpt_ + digits + .h5 ordered by value. A run
    resumed at step 99999999 writes ckpt_100000000.h5 (nine digits), which --resume auto,
    eval, inspect and generate of the run directory take as the newest and train.keep
    prunes by; names outside the rule are neither listed nor removed."""
    d, ini, ck, tok = base
    out = os.path.join(d, "wide_names")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    old = os.path.join(out, "ckpt_99999999.h5")
    mutated_copy(ck, old, lambda f: f.attrs.__setitem__("step", np.int64(99999999)))
    foreign = ["ckpt_1e3.h5", "ckpt_-1.h5", "ckpt_.h5", "ckpt_99999999999999999999.h5"]
    for name in foreign:
        shutil.copy(ck, os.path.join(out, name))
    sets = ["--set", f"train.out_dir={out}", "--set", "train.keep=2", "--set", "train.eval_interval=0"]
    r, seconds = timed(momfmm, ["train", ini, *sets, "--set", "train.steps=100000001", "--resume", "auto"])
    left = sorted(os.listdir(out))
    report.check("resume auto at step 99999999: two steps, exit 0", r.returncode == 0 and
                 "resumed from" in r.stdout and "ckpt_99999999.h5" in r.stdout, r.stderr[-300:])
    report.check("train.keep = 2 keeps ckpt_100000000.h5 and ckpt_100000001.h5, prunes ckpt_99999999.h5",
                 "ckpt_100000000.h5" in left and "ckpt_100000001.h5" in left and "ckpt_99999999.h5" not in left,
                 str(left))
    report.check("names outside the rule are not checkpoints: neither pruned nor read",
                 all(n in left for n in foreign), str(left))
    for cmd in (["inspect", out], ["eval", out], ["generate", out, "--prompt", "1,2", "--tokens", "2"]):
        r, seconds = timed(momfmm, cmd)
        report.check(f"{cmd[0]} RUN_DIR reads the newest, ckpt_100000001.h5", r.returncode == 0 and
                     "ckpt_100000001.h5" in r.stdout and not any(m in r.stderr for m in SANITIZER_MARKS),
                     (r.stdout + r.stderr)[-300:])
    r, seconds = timed(momfmm, ["train", ini, *sets, "--set", "train.steps=100000002", "--resume", "auto"])
    report.check("resume auto takes ckpt_100000001.h5 over the eight-digit names", r.returncode == 0 and
                 "resumed from" in r.stdout and "ckpt_100000001.h5" in r.stdout, r.stdout[-300:])


# ---- self-consistency on every load (docs/files.md §4): config_ini and the tensors agree,
# and a tokenizer model is read whole ----

def test_config_and_tensors_agree(momfmm, base, report):
    """A checkpoint holding a tensor its config_ini does not imply loads as nothing: every
    reader (eval, inspect, generate, loss, logits, train --init, --resume) exits 3 naming it."""
    d, ini, ck, tok = base  # n_layers 1, softmax, lm, momentum on (gamma 0.2), learn_gamma false
    def add(name, shape):
        return lambda f: f.create_dataset(name, data=np.zeros(shape, np.float32))

    def fewer_layers(f):  # a two-block model whose config names one
        f["model"].copy(f["model/blocks/0"], "blocks/1")

    cases = [("config_ini names fewer layers than stored", fewer_layers, "/model/blocks/1"),
             ("FMM blend logits in a softmax model", add("model/blocks/0/attn/fmm_blend", (2, 4)), "fmm_blend"),
             ("a learned gamma that config_ini does not learn", add("model/blocks/0/attn/momentum_gamma", (4,)),
              "momentum_gamma"),
             ("a cls head in an lm model", add("model/cls/bias", (10,)), "/model/cls"),
             ("a second block of momentum buffers", add("buffers/blocks/1/attn/prev_q", (4, 8)),
              "/buffers/blocks/1"),
             ("a soft link among the tensors", lambda f: f.__setitem__("model/alias", h5py.SoftLink("/model/tok_emb")),
              "/model/alias is a soft link")]
    tokens = os.path.join(d, "agree_tokens.h5")
    with h5py.File(tokens, "w") as f:
        f["tokens"] = np.arange(8, dtype=np.int32) % 32
    out = os.path.join(d, "agree_run")
    train = ["train", ini, "--set", f"train.out_dir={out}"]
    readers = [("eval", lambda p: ["eval", p]), ("inspect", lambda p: ["inspect", p]),
               ("generate", lambda p: ["generate", p, "--prompt", "1"]), ("loss", lambda p: ["loss", p, tok]),
               ("logits", lambda p: ["logits", p, tokens, "--force", "--out", os.path.join(d, "agree_logits.h5")]),
               ("train --init", lambda p: train + ["--init", p]), ("train --resume", lambda p: train + ["--resume", p])]
    for i, (what, mutate, needle) in enumerate(cases):
        bad = os.path.join(d, f"agree_{i}.h5")
        mutated_copy(ck, bad, mutate)
        for reader, args in readers:
            r, seconds = timed(momfmm, args(bad))
            refused(report, f"{reader}: {what}: exit 3", r, seconds, 3, needle)
    # /optim is read where a run resumes: an extra moment refuses --resume, not eval
    bad = os.path.join(d, "agree_optim.h5")
    mutated_copy(ck, bad, add("optim/m/blocks/1/ln1/weight", (32,)))
    r, seconds = timed(momfmm, ["train", ini, "--set", f"train.out_dir={out}", "--resume", bad])
    refused(report, "train --resume: an AdamW moment beyond the model: exit 3", r, seconds, 3, "/optim/m/blocks/1")
    r, seconds = timed(momfmm, ["eval", bad])
    report.check("eval of the same file reads (it does not read /optim)", r.returncode == 0, r.stderr[-300:])


def sentencepiece_model(pieces=("<unk>", "a", "b", "\u2581c", "<0x41>"), vocab=None):
    """The bytes of a small sentencepiece ModelProto: pieces, a trainer_spec with vocab_size,
    a normalizer_spec, in that order (as sentencepiece writes them)."""
    def field(number, payload):
        return bytes([number << 3 | 2, len(payload)]) + payload
    out = b""
    for p in pieces:
        kind = 6 if p.startswith("<0x") else 2 if p == "<unk>" else 1
        out += field(1, field(1, p.encode()) + bytes([3 << 3, kind]))
    out += field(2, bytes([4 << 3, vocab or len(pieces), 3 << 3, 2]))
    return out + field(3, field(1, b"identity"))


def test_tokenizer_whole_or_refused(momfmm, base, report):
    """data.tokenizer is read whole before a run starts (a model cut anywhere exits 3 with one
    line, nothing trained or written); a checkpoint's /tokenizer is read whole and must be the
    model config_ini's data.tokenizer_checksum records, on every load."""
    d, ini, ck, tok = base
    words = os.path.join(d, "words.bin")
    (np.arange(4000) * 7 % 5).astype(np.uint16).tofile(words)
    model = os.path.join(d, "sp.model")
    whole = sentencepiece_model()
    with open(model, "wb") as f:
        f.write(whole)
    sets = ["--set", "data.task=text", "--set", "data.format=tokens", "--set", f"data.path={words}",
            "--set", "train.steps=2"]
    out = os.path.join(d, "tok_run")
    shutil.rmtree(out, ignore_errors=True)
    r, seconds = timed(momfmm, ["train", ini, *sets, "--set", f"data.tokenizer={model}", "--set",
                                f"train.out_dir={out}"])
    report.check("a whole model: the run trains, its checkpoints carry /tokenizer", r.returncode == 0 and
                 "tokenizer" in h5py.File(os.path.join(out, "ckpt_00000002.h5"), "r"), r.stderr[-300:])
    cuts = sorted({1, 7, len(whole) // 2, len(whole) - 14, len(whole) - 1})
    for cut in cuts:
        cut_model = os.path.join(d, f"sp_cut{cut}.model")
        with open(cut_model, "wb") as f:
            f.write(whole[:cut])
        fresh = os.path.join(d, f"tok_cut{cut}")
        r, seconds = timed(momfmm, ["train", ini, *sets, "--set", f"data.tokenizer={cut_model}", "--set",
                                    f"train.out_dir={fresh}"])
        refused(report, f"data.tokenizer cut to {cut} of {len(whole)} bytes: exit 3 before the run", r, seconds, 3,
                cut_model, "not a sentencepiece model")
        report.check(f"  nothing written (no {os.path.basename(fresh)})", not os.path.exists(fresh))
    ckpt = os.path.join(out, "ckpt_00000002.h5")
    for what, payload, needle in (("cut short", whole[:-14], "not a sentencepiece model"),
                                  ("another model", sentencepiece_model(pieces=("<unk>", "x", "y")), "checksum")):
        bad = os.path.join(d, f"tok_{what.split()[0]}.h5")
        mutated_copy(ckpt, bad, replace_dataset("tokenizer", lambda f, p, b=payload: f.create_dataset(
            p, data=np.frombuffer(b, np.uint8))))
        for cmd in (["eval", bad], ["inspect", bad], ["generate", bad, "--prompt", "1"]):
            r, seconds = timed(momfmm, cmd)
            refused(report, f"{cmd[0]}: /tokenizer {what}: exit 3", r, seconds, 3, "/tokenizer", needle)


def test_nonfinite_checkpoints(momfmm, base, report):
    from momfmm.h5 import RunError, load_checkpoint
    d, ini, ck, tok = base

    def poke(name, index, value):
        def mutate(f):
            x = f[name][()]
            x.reshape(-1)[index] = value
            f[name][()] = x
        return mutate

    cases = [("NaN in /model/tok_emb", poke("model/tok_emb", 7, np.nan), "/model/tok_emb[7] = nan", True),
             ("+Inf in a qkv weight", poke("model/blocks/0/attn/qkv/weight", 3, np.inf),
              "/model/blocks/0/attn/qkv/weight[3] = inf", True),
             ("NaN in a momentum buffer", poke("buffers/blocks/0/attn/prev_k", 0, np.nan),
              "/buffers/blocks/0/attn/prev_k holds nan", True),
             ("negative /optim/v", poke("optim/v/tok_emb", 2, -1.0), "/optim/v/tok_emb[2] = -1", False),
             ("NaN in /optim/m", poke("optim/m/ln_f/weight", 0, np.nan), "/optim/m/ln_f/weight[0] = nan", False)]
    for i, (what, mutate, needle, weights) in enumerate(cases):
        bad = os.path.join(d, f"nonfinite_{i}.h5")
        mutated_copy(ck, bad, mutate)
        out = os.path.join(d, f"nonfinite_run_{i}")
        commands = [["train", ini, "--set", f"train.out_dir={out}", "--resume", bad]]
        if weights:
            commands += [["eval", bad], ["inspect", bad], ["generate", bad, "--prompt", "1,2"], ["loss", bad, tok],
                         ["train", ini, "--set", f"train.out_dir={out}_init", "--init", bad]]
        for cmd in commands:
            r, seconds = timed(momfmm, cmd)
            label = cmd[0] + (" " + cmd[-2] if cmd[0] == "train" else "")
            refused(report, f"{label} on {what}: exit 3 naming file and tensor", r, seconds, 3, bad, needle)
        # what eval and inspect read: refused with the weights, read with only /optim damaged
        python_agrees(report, what, bad, {"eval": 3 if weights else 0, "inspect": 3 if weights else 0})
        try:
            load_checkpoint(bad)  # /optim too, as train --resume reads it
            message = ""
        except RunError as exc:
            message = str(exc)
        report.check(f"load_checkpoint with /optim on {what}: refused naming the tensor, as train --resume",
                     needle.split("[")[0].split(" holds")[0] in message, message)


def test_locked_checkpoint(momfmm, base, report):
    """A checkpoint another process holds open for writing (HDF5 file locking) is reported
    as locked, and --resume auto stops there rather than resume from an older one."""
    d, ini, ck, tok = base
    out = os.path.join(d, "locked_run")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    older, newer = os.path.join(out, "ckpt_00000001.h5"), os.path.join(out, "ckpt_00000002.h5")
    shutil.copy(ck, older)
    shutil.copy(ck, newer)
    with h5py.File(older, "a") as f:
        f.attrs["step"] = np.int64(1)
    holder = subprocess.Popen(["/usr/bin/python3", "-c", "import h5py, sys, time\n"
                               f"f = h5py.File({newer!r}, 'a'); print('open', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        report.check("a writer holds the newest checkpoint", holder.stdout.readline().strip() == "open")
        r, seconds = timed(momfmm, ["inspect", newer])
        refused(report, "inspect of a locked checkpoint: exit 3, 'locked', not 'corrupt?'", r, seconds, 3, newer,
                "locked by another process")
        r, seconds = timed(momfmm, ["train", ini, "--set", f"train.out_dir={out}", "--set", "train.steps=4",
                                    "--resume", "auto"])
        refused(report, "--resume auto stops at the locked checkpoint: exit 3", r, seconds, 3, newer,
                "locked by another process", "not falling back")
        report.check("--resume auto did not resume from the older checkpoint", "resumed from" not in r.stdout,
                     r.stdout[-300:])
        r, seconds = timed(momfmm, ["eval", out])
        refused(report, "eval of the run directory stops at the locked checkpoint", r, seconds, 3, "locked")
        verdicts = python_verdicts(newer)
        report.check("the Python readers refuse the locked checkpoint", verdicts["momfmm.pt.load"] == 3 and
                     verdicts["momfmm_report.py"] == 3, str(verdicts))
        r = run(["/usr/bin/python3", REPORT_TOOL, out], timeout=TIMEOUT_S)
        report.check("momfmm_report.py of the run directory stops at it too (exit 3, not falling back)",
                     r.returncode == 3 and "locked" in r.stderr and "not falling back" in r.stderr, r.stderr[-300:])
    finally:
        holder.communicate("", timeout=30)
    r = run([momfmm, "inspect", newer], timeout=TIMEOUT_S)
    report.check("once the writer closed it, the checkpoint loads", r.returncode == 0, r.stderr[-300:])


def test_mismatched_ranks(momfmm, base, report):
    """MPMD launches whose ranks read different configs: exit 2 before any allocation,
    naming the first differing key and the ranks (it hung, overflowed MPI_Bcast, or
    trained diverged weights)."""
    from common import MPIRUN
    d, ini, ck, tok = base
    for i, (key, value) in enumerate((("train.steps", "6"), ("model.d_model", "64"), ("train.lr", "0.02"))):
        out = os.path.join(d, f"ranks_{i}")
        shutil.rmtree(out, ignore_errors=True)
        cmd = [*MPIRUN, "-np", "1", momfmm, "train", ini, "--set", f"train.out_dir={out}", ":",
               "-np", "1", momfmm, "train", ini, "--set", f"train.out_dir={out}", "--set", f"{key}={value}"]
        start = time.time()
        r = run(cmd, timeout=120)
        seconds = time.time() - start
        msgs = [l for l in r.stderr.splitlines() if l.startswith("momfmm:")]
        ok = (r.returncode == 2 and seconds < 60 and len(msgs) == 1 and key in msgs[0] and "rank 0" in msgs[0]
              and "rank 1" in msgs[0] and f"vs {value}" in msgs[0]
              and not any(m in r.stderr for m in SANITIZER_MARKS))
        report.check(f"ranks differing in {key}: exit 2 naming it and ranks 0 and 1", ok,
                     f"rc {r.returncode} in {seconds:.1f} s: {msgs}")
        report.check(f"ranks differing in {key}: no checkpoint written",
                     not os.path.exists(out) or not any(n.startswith("ckpt_") for n in os.listdir(out)))


def test_escaped_strings(momfmm, base, report):
    """String values with a newline, ' ;' and '#' survive config_ini: every checkpoint of the
    run loads, --resume auto continues it, and the Python reader sees the same value."""
    from momfmm.h5 import load_checkpoint
    d, ini, ck, tok = base
    out = os.path.join(d, "esc\nline ;semi #hash \"q\"\\b")
    r = run([momfmm, "train", ini, "--set", f"train.out_dir={out}"], timeout=TIMEOUT_S)
    report.check("a run with newline, ' ;', '#', quote and backslash in train.out_dir", r.returncode == 0,
                 r.stderr[-300:])
    r = run([momfmm, "train", ini, "--set", f"train.out_dir={out}", "--set", "train.steps=6", "--resume", "auto"],
            timeout=TIMEOUT_S)
    report.check("--resume auto continues it (its checkpoints load)", r.returncode == 0 and "resumed from" in r.stdout
                 and "at step 4" in r.stdout, (r.stdout + r.stderr)[-400:])
    ck6 = os.path.join(out, "ckpt_00000006.h5")
    report.check("config_ini's out_dir reads back in Python", os.path.exists(ck6) and
                 load_checkpoint(ck6).config.get("train", "out_dir") == out)
    r = run([momfmm, "inspect", ck6], timeout=TIMEOUT_S)
    report.check("inspect prints it escaped, on one line", r.returncode == 0 and
                 'out_dir = "' + out.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
                 in r.stdout, r.stdout[-300:])
    # config syntax at the edges
    r = run([momfmm, "init", ini, "--set", "train.lr = 0.01", "--out", os.path.join(d, "esc_init.h5"), "--force"],
            timeout=TIMEOUT_S)
    report.check("--set 'train.lr = 0.01' (blanks around the key) works", r.returncode == 0, r.stderr[-300:])
    r = run([momfmm, "init", ini, "--set", "train.lr=1e400", "--out", os.path.join(d, "never.h5")], timeout=TIMEOUT_S)
    report.check("train.lr=1e400 is out of range", r.returncode == 2 and "out of range" in r.stderr, r.stderr[-300:])
    r = run([momfmm, "init", ini, "--set", "train.lr=\x1b[31m", "--out", os.path.join(d, "never.h5")],
            timeout=TIMEOUT_S)
    report.check("control bytes of a value are escaped in the message", r.returncode == 2 and "\x1b" not in r.stderr
                 and "\\x1b" in r.stderr, repr(r.stderr[-300:]))
    # a checkpoint's data.path with an escape sequence: shown escaped when it cannot be opened
    text_ini = os.path.join(d, "esc_text.ini")
    with open(text_ini, "w") as f:
        f.write(TEXT.format(path='"/nonexistent/\\x1b[31mred"', out=os.path.join(d, "esc_text")))
    text_ck = os.path.join(d, "esc_text.h5")
    r = run([momfmm, "init", text_ini, "--out", text_ck, "--force"], timeout=TIMEOUT_S)
    report.check("init of a text config whose data.path holds ESC", r.returncode == 0, r.stderr[-300:])
    r, seconds = timed(momfmm, ["eval", text_ck])
    refused(report, "eval: the checkpoint's data.path is named with its ESC escaped", r, seconds, 3,
            "/nonexistent/\\x1b[31mred")
    report.check("no raw ESC on stderr", "\x1b" not in r.stderr, repr(r.stderr[-200:]))
    # an embedded NUL in a fixed-length config_ini
    bad = os.path.join(d, "esc_nul.h5")

    def nul(f):
        text = f.attrs["config_ini"]
        text = text.decode() if isinstance(text, bytes) else text
        del f.attrs["config_ini"]
        f.attrs["config_ini"] = np.bytes_(text.replace("[train]", "\0[train]").encode())
    mutated_copy(ck, bad, nul)
    r, seconds = timed(momfmm, ["eval", bad])
    refused(report, "config_ini with an embedded NUL: exit 3", r, seconds, 3, bad, "config_ini", "NUL")
    python_agrees(report, "config_ini with an embedded NUL", bad, {"eval": r.returncode})


def test_init_and_overwrite(momfmm, base, report):
    d, ini, ck, tok = base
    out = os.path.join(d, "init_over")
    shutil.rmtree(out, ignore_errors=True)
    assert run([momfmm, "train", ini, "--set", f"train.out_dir={out}"], timeout=TIMEOUT_S).returncode == 0
    before = sorted(os.listdir(out))
    source = os.path.join(out, "ckpt_00000004.h5")
    r, seconds = timed(momfmm, ["train", ini, "--set", f"train.out_dir={out}", "--init", source, "--overwrite"])
    refused(report, "--init from the run directory --overwrite would empty: exit 2", r, seconds, 2, source,
            "--overwrite")
    report.check("nothing was removed", sorted(os.listdir(out)) == before, str(os.listdir(out)))
    fresh = os.path.join(d, "init_never")
    shutil.rmtree(fresh, ignore_errors=True)
    for what, args, code in (("a missing --init", ["--init", os.path.join(d, "nope.h5")], 3),
                             ("an --init of another model", ["--init", ck, "--set", "model.d_model=64"], 3)):
        r, seconds = timed(momfmm, ["train", ini, "--set", f"train.out_dir={fresh}", *args])
        refused(report, f"{what}: exit {code}", r, seconds, code, "--init")
        report.check(f"{what} creates no out_dir", not os.path.exists(fresh))
    r = run([momfmm, "train", ini, "--set", f"train.out_dir={fresh}", "--init", source], timeout=TIMEOUT_S)
    report.check("--init from another directory's checkpoint works", r.returncode == 0, r.stderr[-300:])


REPORT_TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "momfmm_report.py")


def test_tensors_of_another_model(momfmm, base):
    """Tensors that config_ini does not name (more layers than model.n_layers, an FMM blend under
    attention.kind = softmax, any other dataset below /model or /buffers): the Python readers
    refuse them naming the tensor (docs/files.md §4). The binary's reader is to refuse them too (its
    change is the C side's): until it does, its acceptance is reported as an expected failure."""
    d, ini, ck, tok = base

    def second_layer(f):
        for name in list(f["model/blocks/0"]):
            f.copy(f[f"model/blocks/0/{name}"], f"model/blocks/1/{name}")

    def blend(f):
        f["model/blocks/0/attn/fmm_blend"] = np.zeros((2, 4), np.float32)

    def extra_model(f):
        f["model/foo"] = np.zeros(3, np.float32)

    def extra_buffer(f):
        f.copy(f["buffers/blocks/0"], "buffers/blocks/5")

    accepted = []
    for i, (what, mutate, needle) in enumerate((
            ("a second layer under model.n_layers = 1", second_layer, "/model/blocks/1"),
            ("fmm_blend under attention.kind = softmax", blend, "/model/blocks/0/attn/fmm_blend"),
            ("an extra /model/foo", extra_model, "/model/foo"),
            ("buffers of a sixth layer", extra_buffer, "/buffers/blocks/5"))):
        bad = os.path.join(d, f"other_model_{i}.h5")
        mutated_copy(ck, bad, mutate)
        verdicts = python_verdicts(bad)
        assert verdicts == {"momfmm.pt.load": 3, "momfmm_report.py": 3}, f"{what}: {verdicts}"
        from momfmm.h5 import RunError, load_checkpoint
        with pytest.raises(RunError, match=re.escape(needle)):
            load_checkpoint(bad, optim=False, metrics=False)
        for command in ("eval", "inspect"):
            r, _ = timed(momfmm, [command, bad])
            assert r.returncode in (0, 3) and not any(m in r.stderr for m in SANITIZER_MARKS), r.stderr[-300:]
            if r.returncode == 0:
                accepted.append(f"{command} {what}")
    assert not accepted, "the binary reads tensors config_ini does not name: " + "; ".join(accepted)
