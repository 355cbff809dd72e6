#!/usr/bin/python3
"""Bad input (SPEC 5): every case exits with the documented code (2 config
or command line, 3 file) and a one-line message naming the file and the key
or value; no crash, and input files are left untouched."""
import hashlib
import os
import shutil

import h5py
import numpy as np

from common import argument_parser, Report, run, tiny_config, write_config, write_tokens


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def expect(report, name, result, code, *needles):
    msg = result.stderr.strip()
    ok = result.returncode == code and all(n in msg for n in needles)
    ok = ok and "Segmentation" not in msg and "AddressSanitizer" not in msg
    report.check(name, ok, f"rc {result.returncode} (want {code}); stderr: {msg[:300]!r}")


def config_cases(a, report, work):
    base = tiny_config(os.path.join(work, "run"))
    good = write_config(os.path.join(work, "good.ini"), base)

    def ini(name, text):
        path = os.path.join(work, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    p = ini("section.ini", "[model]\nd_model = 32\n[modle]\nn_heads = 4\n")
    expect(report, "unknown section", run([a.momfmm, "train", p]), 2, "section.ini:4", "modle")
    p = ini("key.ini", "[model]\nd_model = 32\nd_modle = 4\n")
    expect(report, "unknown key", run([a.momfmm, "train", p]), 2, "key.ini:3", "model.d_modle")
    p = ini("value.ini", "[model]\nd_model = abc\n")
    expect(report, "non-numeric value", run([a.momfmm, "train", p]), 2, "value.ini:2", "model.d_model", "abc")
    p = ini("neg.ini", "[model]\nn_layers = -1\n")
    expect(report, "negative size", run([a.momfmm, "train", p]), 2, "neg.ini:2", "model.n_layers")
    p = ini("div.ini", "[model]\nd_model = 30\nn_heads = 4\n")
    expect(report, "d_model not divisible by n_heads", run([a.momfmm, "train", p]), 2, "div.ini",
           "model.d_model", "model.n_heads")
    p = ini("odd.ini", "[model]\nd_model = 12\nn_heads = 4\n")
    expect(report, "odd head dimension", run([a.momfmm, "train", p]), 2, "odd.ini", "odd")
    p = ini("task.ini", "[data]\ntask = sorting\n")
    expect(report, "unknown task", run([a.momfmm, "train", p]), 2, "task.ini:2", "data.task", "sorting")
    p = ini("kind.ini", "[attention]\nkind = flash\n")
    expect(report, "unknown attention kind", run([a.momfmm, "train", p]), 2, "kind.ini:2", "attention.kind")
    p = ini("band.ini", "[attention]\nkind = fmm\n[fmm]\nbandwidth = -1\n")
    expect(report, "fmm bandwidth < 0", run([a.momfmm, "train", p]), 2, "band.ini:4", "fmm.bandwidth")
    p = ini("kern.ini", "[attention]\nkind = fmm\n[fmm]\nkernels = elu,relu\n")
    expect(report, "unknown fmm kernel", run([a.momfmm, "train", p]), 2, "kern.ini", "fmm.kernels", "relu")
    p = ini("chunk.ini", "[attention]\nkind = fmm\n[fmm]\nchunk = 0\n")
    expect(report, "fmm chunk <= 0", run([a.momfmm, "train", p]), 2, "chunk.ini:4", "fmm.chunk")
    p = ini("bool.ini", "[model]\ncausal = maybe\n")
    expect(report, "bad boolean", run([a.momfmm, "train", p]), 2, "bool.ini:2", "model.causal")
    p = ini("garbage.ini", "[model\nd_model = 32\n")
    expect(report, "malformed INI line", run([a.momfmm, "train", p]), 2, "garbage.ini:1")
    expect(report, "missing config file", run([a.momfmm, "train", os.path.join(work, "nope.ini")]), 2, "nope.ini")
    expect(report, "--set unknown key", run([a.momfmm, "train", good, "--set", "model.nope=1"]), 2, "model.nope")
    expect(report, "--set bad value", run([a.momfmm, "train", good, "--set", "train.lr=fast"]), 2, "train.lr", "fast")
    expect(report, "--set without section", run([a.momfmm, "train", good, "--set", "lr=1"]), 2, "lr=1")
    expect(report, "unknown command", run([a.momfmm, "fly"]), 2, "fly")
    expect(report, "missing argument", run([a.momfmm, "train"]), 2, "missing")
    expect(report, "unknown option", run([a.momfmm, "train", good, "--fast"]), 2, "--fast")
    expect(report, "init without --out", run([a.momfmm, "init", good]), 2, "--out")
    return good


def file_cases(a, report, work, good_ini):
    ck = os.path.join(work, "ck.h5")
    r = run([a.momfmm, "init", good_ini, "--out", ck])
    report.check("init writes a checkpoint", r.returncode == 0 and os.path.exists(ck), r.stderr)
    tok = write_tokens(os.path.join(work, "tok.h5"), np.ones((2, 16)), np.ones((2, 16)))
    r = run([a.momfmm, "loss", ck, tok])
    report.check("loss on good files", r.returncode == 0 and r.stdout.startswith("loss "), r.stdout + r.stderr)

    def variant(name, edit):
        path = os.path.join(work, name)
        shutil.copy(ck, path)
        with h5py.File(path, "r+") as f:
            edit(f)
        return path

    def check_file(name, path, *needles, tokens=tok):
        before = digest(path)
        expect(report, name, run([a.momfmm, "loss", path, tokens]), 3, *needles)
        report.check(name + ": file untouched", digest(path) == before)

    expect(report, "missing checkpoint", run([a.momfmm, "loss", os.path.join(work, "none.h5"), tok]), 3, "none.h5")
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


def main():
    ap = argument_parser(__doc__)
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    report = Report()
    good = config_cases(a, report, a.workdir)
    file_cases(a, report, a.workdir, good)
    report.finish()


if __name__ == "__main__":
    main()
