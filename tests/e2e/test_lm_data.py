"""Token files and validation sets of docs/tasks.md §2 through the momfmm
binary: nanoGPT's .bin as numpy's `tofile` writes it, llm.c's headered .bin
as its dev/data scripts write it, and HDF5 `/tokens` (uint16, int32) as h5py
writes it, all train at model.vocab_size 512; an id out of the vocabulary,
a chunked dataset and a bad header exit 3 naming the file; data.eval_path
replaces the carved split; the start-up corpus line; a directory with a
dangling link and a binary trains with a warning for each.

Run with MOMFMM_BIN=<build>/momfmm /usr/bin/python3 -m pytest <this file>."""
import importlib.util
import math
import os
import shutil
import re
import subprocess
import sys

import h5py
import numpy as np
import pytest

from common import run, write_config

VOCAB = 512


def ids(n, seed):
    """A learnable stream: a repeating pattern with noise, ids below VOCAB."""
    rng = np.random.default_rng(seed)
    base = np.arange(n) * 37 % 500
    return np.where(rng.random(n) < 0.1, rng.integers(0, VOCAB, n), base).astype(np.uint16)


def write_nanogpt(path, tokens):
    """nanoGPT's data/*/prepare.py: np.array(ids, dtype=np.uint16).tofile(path)."""
    np.asarray(tokens, dtype=np.uint16).tofile(path)


def write_llmc(path, tokens, version=1, declared=None):
    """llm.c's dev/data/data_common.py write_datafile: 256 int32 of header
    (magic 20240520, version, token count), then the uint16 tokens."""
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1] = 20240520, version
    header[2] = len(tokens) if declared is None else declared
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())


def write_ini(path, out_dir, data_path, vocab=VOCAB, **data):
    sections = {
        "model": {"vocab_size": vocab, "d_model": 32, "n_heads": 4, "n_layers": 1, "d_ff": 64},
        "data": {"task": "text", "seq_len": 32, "path": data_path, "eval_fraction": 0.2, **data},
        "train": {"steps": 4, "batch_size": 4, "lr": 3e-3, "log_interval": 2, "eval_interval": 4,
                  "eval_batches": 1, "out_dir": out_dir},
    }
    return write_config(str(path), sections)


def train(momfmm, tmp_path, data_path, **kw):
    """A fresh run (its own out_dir) on data_path; kw as data keys."""
    train.runs = getattr(train, "runs", 0) + 1
    ini = write_ini(tmp_path / "t.ini", str(tmp_path / f"out{train.runs}"), str(data_path), **kw)
    return run([momfmm, "train", ini], timeout=120)


@pytest.mark.parametrize("layout", ["nanogpt", "llmc", "h5_uint16", "h5_int32"])
def test_token_file_trains(momfmm, tmp_path, report, layout):
    tokens = ids(4000, 1)
    path = tmp_path / ("train.h5" if layout.startswith("h5") else "train.bin")
    if layout == "nanogpt":
        write_nanogpt(path, tokens)
    elif layout == "llmc":
        write_llmc(path, tokens)
    else:
        with h5py.File(path, "w") as f:
            f["tokens"] = tokens.astype(np.uint16 if layout == "h5_uint16" else np.int32)
    r = train(momfmm, tmp_path, path)
    summary = re.search(r"corpus: 1 document, (\d+) bytes as token ids, 0 skipped .* train (\d+) tokens, "
                        r"eval (\d+) tokens", r.stdout)
    report.check(f"{layout}: trains at vocab_size {VOCAB}", r.returncode == 0, r.stderr[-400:])
    report.check(f"{layout}: corpus line counts 4000 tokens (3200 + 800)",
                 summary is not None and (int(summary[2]), int(summary[3])) == (3200, 800), r.stdout[:600])


def test_bad_token_files_exit_3(momfmm, tmp_path, report):
    tokens = ids(2000, 2)
    tokens[1234] = VOCAB + 3
    write_nanogpt(tmp_path / "big_id.bin", tokens)
    write_llmc(tmp_path / "v7.bin", ids(2000, 2), version=7)
    write_llmc(tmp_path / "lying.bin", ids(2000, 2), declared=3000)
    with h5py.File(tmp_path / "chunked.h5", "w") as f:
        f.create_dataset("tokens", data=ids(2000, 2), chunks=(500,), compression="gzip")
    with h5py.File(tmp_path / "float.h5", "w") as f:
        f["tokens"] = ids(2000, 2).astype(np.float32)
    cases = [("big_id.bin", f"token id {VOCAB + 3} at token 1234 (byte offset 2468)"),
             ("v7.bin", "version 7"), ("lying.bin", "declares 3000 tokens"),
             ("chunked.h5", "cannot be memory-mapped"), ("float.h5", "integers")]
    for name, why in cases:
        r = train(momfmm, tmp_path, tmp_path / name)
        report.check(f"{name}: exit 3 naming the file ({why})",
                     r.returncode == 3 and name in r.stderr and why in r.stderr, r.stderr[-300:])


def test_eval_path_is_the_eval_split(momfmm, tmp_path, report):
    write_nanogpt(tmp_path / "train.bin", ids(3000, 3))
    write_nanogpt(tmp_path / "val.bin", ids(700, 4))
    r = train(momfmm, tmp_path, tmp_path / "train.bin", eval_path=str(tmp_path / "val.bin"))
    line = re.search(r"corpus: .*\n", r.stdout)
    report.check("eval_path: trains", r.returncode == 0, r.stderr[-300:])
    report.check("eval_path: all of data.path trains, all of data.eval_path evaluates",
                 line is not None and "data.eval_path, 1 document, 1400 bytes" in line[0] and
                 "train 3000 tokens, eval 700 tokens" in line[0], r.stdout[:600])
    (tmp_path / "val.txt").write_text("text " * 200)
    r = train(momfmm, tmp_path, tmp_path / "train.bin", eval_path=str(tmp_path / "val.txt"), format="tokens")
    report.check("eval_path: a text file read as tokens refused", r.returncode == 3 and "val.txt" in r.stderr,
                 r.stderr[-300:])


def test_directory_skips_with_warnings(momfmm, tmp_path, report):
    docs = tmp_path / "docs"
    (docs / "pkg" / "__pycache__").mkdir(parents=True)
    for i in range(3):
        (docs / "pkg" / f"m{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" * 40)
    (docs / "pkg" / "__pycache__" / "m0.pyc").write_bytes(b"\x00\x01compiled" * 50)
    (docs / "README").write_text("a package of three modules\n" * 20)
    (docs / "gone.txt").symlink_to(tmp_path / "nowhere.txt")
    r = train(momfmm, tmp_path, docs, vocab=256, exclude="*.md", eval_path="")
    warnings = [l for l in r.stdout.splitlines() if l.startswith("warning:")]
    report.check("walk: trains past a dangling link and a binary", r.returncode == 0, r.stderr[-300:])
    report.check("walk: one warning line each, naming the file",
                 len(warnings) == 2 and any("gone.txt" in w and "dangling" in w for w in warnings) and
                 any("m0.pyc" in w and "binary" in w for w in warnings), "\n".join(warnings))
    report.check("walk: the corpus line counts 4 documents and 2 skipped",
                 "corpus: 4 documents" in r.stdout and "2 skipped" in r.stdout, r.stdout[:600])
    r = train(momfmm, tmp_path, docs, vocab=256, include="*.py", exclude="__pycache__/*")
    report.check("walk: data.include/exclude leave 3 documents, nothing to warn about",
                 r.returncode == 0 and "corpus: 3 documents" in r.stdout and "warning:" not in r.stdout,
                 r.stdout[:600])


TOKENIZE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "momfmm_tokenize.py")


@pytest.mark.skipif(importlib.util.find_spec("sentencepiece") is None,
                    reason="python3-sentencepiece is not installed (tools/install_deps.sh)")
def test_tokenize_then_train(momfmm, tmp_path, report):
    """momfmm-tokenize: a BPE model with byte fallback, token files that decode to the text
    exactly (NUL-free text, documents joined by the end-of-text id), and a run on them."""
    docs = tmp_path / "docs"
    docs.mkdir()
    rng = np.random.default_rng(5)
    words = ["momentum", "attention", "the", "field", "multipole", "é", "→", "\n", "  ", "x1 = 42;"]
    for i in range(4):
        (docs / f"d{i}.txt").write_text(" ".join(rng.choice(words, 400)))
    (docs / "blob.bin.pyc").write_bytes(b"\0\1" * 100)
    val = tmp_path / "val.txt"
    val.write_text(" ".join(rng.choice(words, 300)))
    out = tmp_path / "tok"
    r = run([sys.executable, TOKENIZE, "train", docs, "--vocab-size", 300, "--out", out, "--eval-path", val])
    report.check("tokenize train: exit 0, a warning for the binary", r.returncode == 0 and "blob.bin.pyc" in r.stdout,
                 r.stdout + r.stderr)
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=str(out / "tokenizer.model"))
    ids = np.fromfile(out / "val.bin", dtype=np.uint16)
    report.check("val.bin decodes to the validation text byte for byte",
                 sp.decode(ids.tolist()) == val.read_text() and sp.get_piece_size() == 300)
    r = run([sys.executable, TOKENIZE, "decode", "--model", out / "tokenizer.model", out / "val.bin"])
    report.check("tokenize decode prints the text", r.returncode == 0 and r.stdout == val.read_text(), r.stderr)
    train_ids = np.fromfile(out / "train.bin", dtype=np.uint16)
    report.check("train.bin: 4 documents joined by 3 end-of-text ids",
                 int((train_ids == sp.eos_id()).sum()) == 3, f"{(train_ids == sp.eos_id()).sum()}")
    model = out / "tokenizer.model"
    r = train(momfmm, tmp_path, out / "train.bin", vocab=320, eval_path=str(out / "val.bin"), tokenizer=str(model))
    run_dir = tmp_path / f"out{train.runs}"
    report.check("momfmm trains on the token files (vocab_size 320 > 300 pieces)", r.returncode == 0,
                 r.stderr[-300:])
    pieces = [len(sp.decode([int(i)]).encode()) for i in range(sp.get_piece_size())]
    report.check("train log: every step line shows bpb", re.search(r"^step 4/4 \| loss \S+ \| bpb \S+ \|", r.stdout, re.M),
                 r.stdout[-400:])
    with h5py.File(run_dir / "metrics.h5", "r") as f:
        loss, bpb = f["metrics/train/loss"][()], f["metrics/train/bpb"][()]
    # a train batch's targets decode to between 1 and max(pieces) bytes each, more than 1 on average here
    report.check("metrics.h5 /metrics/train/bpb: from the bytes of the step's targets",
                 len(bpb) == len(loss) > 0 and np.all(bpb < loss / math.log(2)) and
                 np.all(bpb > loss / (math.log(2) * max(pieces))), f"{bpb} {loss}")
    r = run([momfmm, "eval", run_dir, "--batches", "all"])
    m = re.search(r"^eval \| loss (\S+) \| bpb (\S+) \|", r.stdout, re.M)
    windows = (len(ids) - 1) // 32
    nbytes = sum(pieces[int(i)] for i in ids[1:windows * 32 + 1])
    want = float(m[1]) * windows * 32 / (math.log(2) * nbytes) if m else None
    report.check("eval --batches all: bpb from the bytes of the evaluated tokens",
                 m is not None and abs(float(m[2]) / want - 1) < 1e-5, f"{m and m[0]} vs {want}")
    prompt = ",".join(str(i) for i in sp.encode("momentum attention"))
    r = run([momfmm, "generate", run_dir / "ckpt_00000004.h5", "--prompt", prompt, "--tokens", 5, "--seed", 1, "--temperature", 1])
    report.check("generate decodes with data.tokenizer",
                 r.returncode == 0 and "\ntext: momentum attention" in r.stdout, r.stdout + r.stderr)
    ckpt = run_dir / "ckpt_00000004.h5"
    os.replace(model, tmp_path / "aside.model")
    r = run([momfmm, "generate", ckpt, "--prompt", prompt, "--tokens", 5, "--seed", 1, "--temperature", 1])
    os.replace(tmp_path / "aside.model", model)
    report.check("generate decodes with the model the checkpoint carries (/tokenizer), the file moved away",
                 r.returncode == 0 and "\ntext: momentum attention" in r.stdout, r.stdout + r.stderr)
    damaged = tmp_path / "damaged.h5"
    shutil.copy(ckpt, damaged)
    with h5py.File(damaged, "r+") as f:
        del f["tokenizer"]
        f["tokenizer"] = np.frombuffer(b"\xff" * 64, dtype=np.uint8)
    os.replace(model, tmp_path / "aside.model")
    r = run([momfmm, "generate", damaged, "--prompt", prompt, "--tokens", 2])
    os.replace(tmp_path / "aside.model", model)
    # docs/files.md §4: every load reads /tokenizer whole, as the model config_ini records
    report.check("a damaged /tokenizer: the checkpoint is refused (exit 3), naming it",
                 r.returncode == 3 and "/tokenizer" in r.stderr and "not a sentencepiece model" in r.stderr,
                 r.stdout + r.stderr)
    run([sys.executable, TOKENIZE, "train", docs, "--vocab-size", 280, "--out", tmp_path / "tok2"])
    os.replace(tmp_path / "tok2" / "tokenizer.model", model)
    r = run([momfmm, "eval", run_dir])
    report.check("another model under data.tokenizer's name: exit 3 naming the checksum",
                 r.returncode == 3 and "tokenizer.model" in r.stderr and "checksum" in r.stderr, r.stderr)
    (tmp_path / "junk.model").write_bytes(b"\xff" * 40)
    r = train(momfmm, tmp_path, out / "train.bin", vocab=320, tokenizer=str(tmp_path / "junk.model"))
    report.check("a file that is no sentencepiece model: exit 3", r.returncode == 3 and "junk.model" in r.stderr,
                 r.stderr)
    r = run([sys.executable, TOKENIZE, "decode", "--model", tmp_path / "tok2" / "x.model", out / "val.bin"])
    report.check("tokenize decode of a missing model fails", r.returncode != 0)


def test_tokenize_decode_refuses_what_train_refuses(momfmm, tmp_path, report):
    """The same token files through momfmm (data.path with data.format = tokens: `momfmm data`
    reads the corpus) and through `momfmm-tokenize decode` with a model of as many pieces as
    model.vocab_size (docs/cli.md §5): decode refuses a file (exit 3, one line naming it) exactly when
    the binary does, and prints the bytes of the files it reads."""
    docs = tmp_path / "docs"
    docs.mkdir()
    rng = np.random.default_rng(9)
    (docs / "a.txt").write_text(" ".join(rng.choice(["near", "far", "field", "é", "\n", "x = 1;"], 600)))
    model = tmp_path / "tok" / "tokenizer.model"
    r = run([sys.executable, TOKENIZE, "train", docs, "--vocab-size", 300, "--out", tmp_path / "tok"])
    assert r.returncode == 0, r.stderr
    import sentencepiece as spm
    pieces = spm.SentencePieceProcessor(model_file=str(model)).get_piece_size()
    good = np.arange(400) % pieces
    files = {
        "nanogpt.bin": lambda p: write_nanogpt(p, good),
        "llmc.bin": lambda p: write_llmc(p, good),
        "odd.bin": lambda p: p.write_bytes(good.astype("<u2").tobytes() + b"\x01"),
        "id_past_pieces.bin": lambda p: write_nanogpt(p, np.r_[good, pieces]),
        "llmc_v7.bin": lambda p: write_llmc(p, good, version=7),
        "llmc_lying.bin": lambda p: write_llmc(p, good, declared=900),
        "llmc_short.bin": lambda p: p.write_bytes(np.array([20240520, 1, 3], "<i4").tobytes()),
        "empty.bin": lambda p: p.write_bytes(b""),
    }
    for name, dtype, kw in (("h5_u16.h5", "<u2", {}), ("h5_i32.h5", "<i4", {}), ("h5_chunked.h5", "<u2",
                            {"chunks": (100,)}), ("h5_gzip.h5", "<u2", {"compression": "gzip"}),
                            ("h5_float.h5", "<f4", {}), ("h5_i64.h5", "<i8", {}), ("h5_big_endian.h5", ">u2", {}),
                            ("h5_u32.h5", "<u4", {})):
        files[name] = lambda p, dtype=dtype, kw=kw: h5py.File(p, "w").create_dataset("tokens", data=good.astype(dtype),
                                                                                       **kw).file.close()
    files["h5_negative.h5"] = lambda p: h5py.File(p, "w").create_dataset(
        "tokens", data=np.r_[good, -1].astype("<i4")).file.close()
    files["h5_2d.h5"] = lambda p: h5py.File(p, "w").create_dataset("tokens", data=good.reshape(2, -1)
                                                                     .astype("<u2")).file.close()
    files["h5_empty.h5"] = lambda p: h5py.File(p, "w").create_dataset("tokens", data=np.zeros(0, "<u2")).file.close()
    files["h5_no_tokens.h5"] = lambda p: h5py.File(p, "w").create_dataset("ids", data=good.astype("<u2")).file.close()
    files["h5_linked.h5"] = lambda p: h5py.File(p, "w").__setitem__(
        "tokens", h5py.ExternalLink(str(tmp_path / "h5_u16.h5"), "/tokens"))
    ini = write_ini(tmp_path / "d.ini", str(tmp_path / "never"), "unset", vocab=pieces, format="tokens",
                    eval_fraction=0.5)
    printed = set()
    for name, make in files.items():
        path = tmp_path / name
        make(path)
        binary = run([momfmm, "data", ini, "--set", f"data.path={path}", "--show", 1], timeout=60)
        python = subprocess.run([sys.executable, TOKENIZE, "decode", "--model", str(model), str(path)],
                                capture_output=True, timeout=60)
        err = python.stderr.decode(errors="replace").strip()
        agree = (binary.returncode != 0) == (python.returncode != 0) and python.returncode in (0, 3)
        report.check(f"{name}: decode {'refuses' if python.returncode else 'reads'} it as momfmm does "
                     f"(exit {python.returncode} vs {binary.returncode})",
                     agree and (python.returncode == 0 or (len(err.splitlines()) == 1 and name in err)),
                     f"momfmm: {binary.stderr.strip()[-200:]!r}; decode: {err[-300:]!r}")
        if python.returncode == 0:
            printed.add(python.stdout)
    report.check("every token file it reads prints the same bytes (the same ids)", len(printed) == 1, str(len(printed)))
