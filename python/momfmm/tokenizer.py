"""momfmm-tokenize: subword tokens for the text task (docs/tasks.md §2, token files).

Trains a sentencepiece BPE or unigram model (Debian's python3-sentencepiece) on a corpus given
as `data.path` is (a file, a directory walked in sorted order, a comma-separated list; hidden,
empty and binary files left out, data.include / data.exclude globs), with byte fallback so that
no text is unknown and identity normalisation so that decoding gives the bytes back, and writes
token files that `momfmm train` reads: nanoGPT's flat uint16 .bin (the default), llm.c's
headered .bin or an HDF5 /tokens dataset. Documents are joined by the model's end-of-text id.

    momfmm-tokenize train CORPUS --vocab-size 2048 --out DIR [--type bpe|unigram] [--eval-path VAL]
    momfmm-tokenize encode --model DIR/tokenizer.model CORPUS --out FILE.bin [--format nanogpt|llmc|hdf5]
    momfmm-tokenize decode --model DIR/tokenizer.model FILE.bin|ID ...
    momfmm-tokenize ids --model DIR/tokenizer.model TEXT      # for momfmm generate --prompt

`train` writes DIR/tokenizer.model, DIR/train.bin (and DIR/val.bin with --eval-path) and prints
the config keys that train on them."""
import argparse
import fnmatch
import os
import sys

import numpy as np

LLMC_MAGIC, LLMC_VERSION = 20240520, 1
SNIFF = 4096  # a text file with a NUL byte in its first 4 KiB is binary (docs/tasks.md §2)


def _globbed(rel, patterns):
    """Whether a glob matches rel or one of its tails after a '/' (as corpus.c matches)."""
    tails = [rel] + [rel[i + 1:] for i, c in enumerate(rel) if c == "/"]
    return any(fnmatch.fnmatchcase(t, p) for p in patterns for t in tails)


def documents(spec, include="", exclude=""):
    """The document paths of a data.path spec, in the C reader's order, and the skipped ones."""
    inc = [p for p in include.split(",") if p]
    exc = [p for p in exclude.split(",") if p]
    paths, skipped = [], []
    for item in spec.split(","):
        if not os.path.isdir(item):
            paths.append(item)
            continue
        found = []
        for root, dirs, files in os.walk(item):
            dirs[:] = [d for d in dirs if not d.startswith(".") and not os.path.islink(os.path.join(root, d))]
            for name in files:
                path = os.path.join(root, name)
                rel = os.path.relpath(path, item)
                if name.startswith(".") or (inc and not _globbed(rel, inc)) or _globbed(rel, exc):
                    continue
                try:
                    if not os.path.isfile(path) or os.path.getsize(path) == 0:
                        continue
                    with open(path, "rb") as f:
                        if b"\0" in f.read(SNIFF):
                            skipped.append((path, "binary"))
                            continue
                except OSError as exc_:
                    skipped.append((path, exc_.strerror))
                    continue
                found.append(path)
        paths += sorted(found, key=lambda p: p.encode())
    return paths, skipped


def read_text(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8", errors="surrogateescape")


def train_model(paths, prefix, vocab_size, model_type):
    """A sentencepiece model that loses nothing: byte fallback, identity normalisation, no
    dummy prefix or whitespace folding, so decode(encode(text)) == text."""
    import sentencepiece as spm

    def lines():
        for p in paths:
            yield from read_text(p).splitlines()

    spm.SentencePieceTrainer.train(
        sentence_iterator=lines(), model_prefix=prefix, vocab_size=vocab_size, model_type=model_type,
        byte_fallback=True, normalization_rule_name="identity", add_dummy_prefix=False,
        remove_extra_whitespaces=False, split_digits=True, hard_vocab_limit=False, character_coverage=0.9995,
        unk_id=0, bos_id=-1, eos_id=1, pad_id=-1, minloglevel=2, max_sentence_length=1 << 16)
    return prefix + ".model"


def encode_corpus(model, paths):
    """The ids of every document, joined by the end-of-text id (uint16 or int32)."""
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=model)
    ids = []
    for i, p in enumerate(paths):
        if i:
            ids.append(sp.eos_id())
        ids += sp.encode(read_text(p))
    dtype = np.uint16 if sp.get_piece_size() <= 1 << 16 else np.int32
    return np.asarray(ids, dtype=dtype), sp.get_piece_size()


def write_tokens(path, ids, fmt):
    """nanoGPT: ids.tofile; llm.c: 256 int32 of header (magic, version 1, count), then uint16;
    hdf5: a contiguous 1-D /tokens (memory-mapped by momfmm)."""
    if fmt == "hdf5":
        import h5py
        with h5py.File(path, "w") as f:
            f.create_dataset("tokens", data=ids)
        return
    if ids.dtype != np.uint16:
        raise SystemExit(f"momfmm-tokenize: {path}: more than 65536 ids need --format hdf5 (int32)")
    if fmt == "llmc":
        header = np.zeros(256, dtype=np.int32)
        header[:3] = LLMC_MAGIC, LLMC_VERSION, len(ids)
        with open(path, "wb") as f:
            f.write(header.tobytes())
            f.write(ids.tobytes())
    else:
        ids.tofile(path)


def read_tokens(path):
    if path.endswith((".h5", ".hdf5")):
        import h5py
        with h5py.File(path, "r") as f:
            return f["tokens"][()]
    raw = np.fromfile(path, dtype=np.uint16)
    head = np.frombuffer(raw[:6].tobytes(), dtype=np.int32) if len(raw) >= 512 else []
    return raw[512:] if len(head) and head[0] == LLMC_MAGIC else raw


def corpus_of(spec, args):
    paths, skipped = documents(spec, args.include, args.exclude)
    for path, why in skipped:
        print(f"warning: {path}: {why}; skipped")
    if not paths:
        raise SystemExit(f"momfmm-tokenize: {spec}: no document")
    return paths


def cmd_train(args):
    os.makedirs(args.out, exist_ok=True)
    paths = corpus_of(args.corpus, args)
    model = train_model(paths, os.path.join(args.out, "tokenizer"), args.vocab_size, args.type)
    ext = ".h5" if args.format == "hdf5" else ".bin"
    keys = []
    for name, spec in (("train", args.corpus), ("val", args.eval_path)):
        if spec is None:
            continue
        ids, vocab = encode_corpus(model, paths if name == "train" else corpus_of(spec, args))
        out = os.path.join(args.out, name + ext)
        write_tokens(out, ids, args.format)
        print(f"{out}: {len(ids)} tokens")
        keys.append(("data.path" if name == "train" else "data.eval_path", out))
    print(f"{model}: {args.type}, {vocab} pieces (byte fallback)")
    keys.append(("data.tokenizer", model))
    print("train with: --set data.task=text --set model.vocab_size=%d %s" % (
        vocab, " ".join(f"--set {k}={v}" for k, v in keys)))
    return 0


def cmd_encode(args):
    ids, _ = encode_corpus(args.model, corpus_of(args.corpus, args))
    write_tokens(args.out, ids, args.format)
    print(f"{args.out}: {len(ids)} tokens")
    return 0


def cmd_decode(args):
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=args.model)
    ids = read_tokens(args.ids[0]) if len(args.ids) == 1 and os.path.isfile(args.ids[0]) else \
        [int(x) for x in args.ids]
    sys.stdout.write(sp.decode([int(i) for i in ids]))
    return 0


def cmd_ids(args):
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=args.model)
    print(",".join(str(i) for i in sp.encode(args.text)))
    return 0


def parser():
    p = argparse.ArgumentParser(prog="momfmm-tokenize", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("train", "encode"):
        s = sub.add_parser(name)
        s.add_argument("corpus", help="a file, directory or comma-separated list, as data.path")
        s.add_argument("--format", choices=("nanogpt", "llmc", "hdf5"), default="nanogpt")
        s.add_argument("--include", default="", help="comma-separated globs, as data.include")
        s.add_argument("--exclude", default="", help="comma-separated globs, as data.exclude")
    t = sub.choices["train"]
    t.add_argument("--vocab-size", type=int, required=True, help="pieces, the 256 byte pieces included")
    t.add_argument("--type", choices=("bpe", "unigram"), default="bpe")
    t.add_argument("--out", required=True, help="directory for tokenizer.model, train.bin, val.bin")
    t.add_argument("--eval-path", help="a validation corpus, encoded to val.bin")
    sub.choices["encode"].add_argument("--model", required=True)
    sub.choices["encode"].add_argument("--out", required=True)
    d = sub.add_parser("decode")
    d.add_argument("--model", required=True)
    d.add_argument("ids", nargs="+", help="a token file, or ids")
    i = sub.add_parser("ids")
    i.add_argument("--model", required=True)
    i.add_argument("text", help="text to encode, printed as comma-separated ids")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        import sentencepiece  # noqa: F401
    except ImportError:
        print("momfmm-tokenize: needs sentencepiece (Debian: apt-get install python3-sentencepiece; "
              "tools/install_deps.sh)", file=sys.stderr)
        return 2
    return {"train": cmd_train, "encode": cmd_encode, "decode": cmd_decode, "ids": cmd_ids}[args.command](args)
