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
the config keys that train on them.

The corpus is read as `momfmm train` reads a text corpus (src/data/corpus.c, data.format = bytes):
bytes, whatever they are; bytes that are not UTF-8 become the model's byte pieces, so the ids
decode to the file's bytes exactly. `decode` reads a token file with the binary's checks
(src/data/token_file.c: llm.c magic, version and size; an HDF5 /tokens 1-D uint16 or int32
little-endian, contiguous, inside the file; nanoGPT's even size; ids below the model's pieces)
and prints the bytes the pieces stand for, as `momfmm generate` does (src/data/tokenizer.c). Outputs
are written whole and never through a symbolic link (momfmm.files.output_path). A user's error is
one line: exit 2 for a value or argument, 3 for a file (docs/cli.md §5)."""
import fnmatch
import os
import re
import signal
import stat
import sys

import numpy as np

from momfmm import files, tool
from momfmm.files import ArgumentError, RunError

PROG = "momfmm-tokenize"
LLMC_MAGIC, LLMC_VERSION, LLMC_HEADER = 20240520, 1, 256 * 4
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
SNIFF = 4096                   # a walked file with a NUL byte in its first 4 KiB is binary (docs/tasks.md §2)
MAX_MODEL_BYTES = 64 << 20     # a sentencepiece model file (src/data/tokenizer.c)
VOCAB_MIN = 259                # the 256 byte pieces, <unk>, </s> and one piece more
VOCAB_MAX = 1 << 24            # model.vocab_size's limit (docs/config.md §6)
UINT16_PIECES = 1 << 16        # nanoGPT's and llm.c's uint16 ids
INT32_MAX = (1 << 31) - 1


# ---------------------------------------------------------------- the corpus (src/data/corpus.c)
def _globbed(rel, patterns):
    """Whether a glob matches rel or one of its tails after a '/' (as corpus.c matches)."""
    tails = [rel] + [rel[i + 1:] for i, c in enumerate(rel) if c == "/"]
    return any(fnmatch.fnmatchcase(t, p) for p in patterns for t in tails)


def _walk(root, directory, inc, exc, found, skipped):
    """Every non-hidden entry of directory, recursively (src/data/corpus.c add_tree, add_entry)."""
    try:
        names = os.listdir(directory)
    except OSError as err:
        if directory == root:
            raise RunError(f"{directory}: cannot read: {err.strerror}") from None
        skipped.append((directory, f"cannot read: {err.strerror}"))
        return
    for name in names:
        if name.startswith("."):
            continue
        path = os.path.join(directory, name)
        try:
            own = os.lstat(path)
        except OSError as err:
            skipped.append((path, f"cannot read: {err.strerror}"))
            continue
        if stat.S_ISDIR(own.st_mode):
            _walk(root, path, inc, exc, found, skipped)
            continue
        rel = os.path.relpath(path, root)
        if (inc and not _globbed(rel, inc)) or _globbed(rel, exc):
            continue
        try:
            target = os.stat(path)
        except OSError as err:
            skipped.append((path, "a dangling symbolic link" if stat.S_ISLNK(own.st_mode) else err.strerror))
            continue
        if not stat.S_ISREG(target.st_mode) or target.st_size == 0:
            continue  # links to directories (a cycle), FIFOs, devices, empty files
        try:
            with files.open_input(path) as f:
                head = f.read(SNIFF)
        except (RunError, OSError) as err:
            skipped.append((path, str(err).split(": ", 1)[-1]))
            continue
        if b"\0" in head:
            skipped.append((path, "binary (a NUL byte in its first 4 KiB)"))
            continue
        found.append(path)


def _refuse_token_file(path, head):
    """RunError for a file named as a document that momfmm would read as a token file or that is an
    HDF5 file of another kind (a checkpoint): its bytes are not text to train or encode (a walk
    skips such files as binary, docs/tasks.md §2)."""
    if len(head) >= 4 and _le32(head) == LLMC_MAGIC:
        raise RunError(f"{path}: an llm.c token file, not a text document (momfmm reads it as data.path)")
    if head[:8] == HDF5_SIGNATURE:
        raise RunError(f"{path}: an HDF5 file, not a text document")


def documents(spec, include="", exclude=""):
    """(paths, skipped) of a data.path spec in the C reader's order: each item of the
    comma-separated list a file (which must be a regular, non-empty file: RunError) or a
    directory walked (hidden entries, links to directories, empty files and files filtered out
    left out; binary, dangling and unreadable files skipped with a reason, [(path, why)]), a
    directory's files sorted by path. RunError for an empty item or a directory with no document."""
    inc = [p for p in include.split(",") if p]
    exc = [p for p in exclude.split(",") if p]
    paths, skipped = [], []
    for item in spec.split(","):
        if not item:
            raise RunError(f"{spec}: an empty path in the comma-separated list")
        if not os.path.isdir(item):
            with files.open_input(item) as f:
                if os.fstat(f.fileno()).st_size == 0:
                    raise RunError(f"{item}: the file is empty")
                _refuse_token_file(item, f.read(SNIFF))
            paths.append(item)
            continue
        found, before = [], len(skipped)
        _walk(item, item, inc, exc, found, skipped)
        if not found:
            raise RunError(f"{item}: the directory holds no non-empty regular file (hidden files are left out, "
                           f"{len(skipped) - before} skipped with a warning"
                           f"{', --include/--exclude applied' if inc or exc else ''})")
        paths += sorted(found, key=os.fsencode)
    return paths, skipped


def read_text(path):
    """A document's bytes as str: bytes that are not UTF-8 as surrogate escapes (U+DC80 + byte)."""
    return files.read_input(path).decode("utf-8", "surrogateescape")


_ESCAPED = re.compile("([\udc80-\udcff])")


def _runs(text):
    """(text, None) for each run of characters and (None, byte) for each byte that was not UTF-8
    (a surrogate escape) of text."""
    for i, part in enumerate(_ESCAPED.split(text)):
        if i % 2:
            yield None, ord(part) - 0xDC00
        elif part:
            yield part, None


# ---------------------------------------------------------------- the model
def load_model(path):
    """A SentencePieceProcessor of the model file at `path`: a regular file (read without
    blocking) of at most 64 MiB that sentencepiece parses; else RunError naming it."""
    import sentencepiece as spm
    data = files.read_input(path, "sentencepiece model", limit=MAX_MODEL_BYTES)
    if not data:
        raise RunError(f"{path}: the file is empty: not a sentencepiece model (momfmm-tokenize train)")
    if data[:8] == HDF5_SIGNATURE:  # as the binary says it (src/data/tokenizer.c)
        raise RunError(f"{path}: not a sentencepiece model (momfmm-tokenize train): an HDF5 file")
    try:
        return spm.SentencePieceProcessor(model_proto=data)
    except RuntimeError:
        raise RunError(f"{path}: not a sentencepiece model (momfmm-tokenize train)") from None


def train_model(paths, vocab_size, model_type):
    """The bytes of a sentencepiece model that loses nothing: byte fallback, identity
    normalisation, no dummy prefix or whitespace folding, so decode(encode(text)) == text.
    ArgumentError when sentencepiece refuses --vocab-size for this corpus, RunError when it
    cannot train on the corpus."""
    import io
    import sentencepiece as spm

    def lines():
        for p in paths:
            for piece, _ in _runs(read_text(p)):
                if piece is not None:
                    yield from (line for line in piece.split("\n") if line)

    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=lines(), model_writer=model, vocab_size=vocab_size, model_type=model_type,
            byte_fallback=True, normalization_rule_name="identity", add_dummy_prefix=False,
            remove_extra_whitespaces=False, split_digits=True, hard_vocab_limit=False, character_coverage=0.9995,
            unk_id=0, bos_id=-1, eos_id=1, pad_id=-1, minloglevel=2, max_sentence_length=1 << 16)
    except RuntimeError as exc:
        reason = str(exc).strip().split("] ")[-1].strip() or str(exc).strip()
        if "ocabulary size" in reason:
            raise ArgumentError(f"--vocab-size {vocab_size}: {reason}") from None
        raise RunError(f"{paths[0]}{' ...' if len(paths) > 1 else ''}: sentencepiece cannot train on the corpus: "
                       f"{reason}") from None
    return model.getvalue()


def encode_text(sp, text):
    """The ids of text (str; surrogate escapes stand for bytes that are not UTF-8, which become
    byte pieces <0xNN>), so that decode_ids gives the bytes back."""
    ids = []
    for piece, byte in _runs(text):
        ids += sp.encode(piece) if piece is not None else [sp.piece_to_id(f"<0x{byte:02X}>")]
    return ids


def encode_corpus(sp, paths):
    """The ids of every document, joined by the end-of-text id: uint16 up to 65536 pieces, else
    int32."""
    ids = []
    for i, p in enumerate(paths):
        if i:
            ids.append(sp.eos_id())
        ids += encode_text(sp, read_text(p))
    return np.asarray(ids, dtype=np.uint16 if sp.get_piece_size() <= UINT16_PIECES else np.int32)


def decode_ids(sp, ids):
    """The bytes `momfmm generate` prints for ids (src/data/tokenizer.c decode_piece): a byte piece
    its byte, a normal or user-defined piece its text with U+2581 as a space, control, unknown and
    unused pieces nothing."""
    out = bytearray()
    for i in ids:
        i = int(i)
        if sp.is_byte(i):
            out.append(int(sp.id_to_piece(i)[3:5], 16))
        elif not (sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i)):
            out += sp.id_to_piece(i).replace("\u2581", " ").encode("utf-8", "surrogateescape")
    return bytes(out)


# ---------------------------------------------------------------- token files (src/data/token_file.c)
def write_tokens(path, ids, fmt, inputs=()):
    """nanoGPT: the ids as little-endian uint16; llm.c: 256 int32 of header (magic, version 1,
    count), then uint16; hdf5: a contiguous 1-D /tokens, uint16 or int32 (memory-mapped by
    momfmm). Through momfmm.files.output_path."""
    if fmt != "hdf5" and ids.dtype != np.uint16:
        raise ArgumentError(f"--format {fmt}: uint16 ids hold at most {UINT16_PIECES} pieces; use --format hdf5")
    if fmt == "llmc" and len(ids) > INT32_MAX:
        raise ArgumentError(f"--format llmc: {len(ids)} tokens do not fit its header; use --format nanogpt or hdf5")
    with files.output_path(path, inputs=inputs, flag="--out") as tmp:
        if fmt == "hdf5":
            import h5py
            with h5py.File(tmp, "w") as f:
                f.create_dataset("tokens", data=ids.astype("<u2" if ids.dtype == np.uint16 else "<i4"))
            return
        with open(tmp, "xb") as f:
            if fmt == "llmc":
                header = np.zeros(256, dtype="<i4")
                header[:3] = LLMC_MAGIC, LLMC_VERSION, len(ids)
                f.write(header.tobytes())
            f.write(ids.astype("<u2").tobytes())


def _le32(b):
    return int(np.frombuffer(b[:4], dtype="<i4")[0])


def read_tokens(path):
    """(ids, offset, width) of a token file as momfmm reads one with data.format = tokens: llm.c's
    magic, else the HDF5 signature, else nanoGPT's flat uint16 (src/data/token_file.c: every check of
    token_file_layout_of): the ids as int64, the byte offset of the first and the bytes of one.
    RunError naming the file and what is wrong."""
    with files.open_input(path, "token file") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise RunError(f"{path}: the file is empty")
        head = f.read(SNIFF)
        if len(head) >= 4 and _le32(head) == LLMC_MAGIC:
            if len(head) < LLMC_HEADER:
                raise RunError(f"{path}: an llm.c token file shorter than its {LLMC_HEADER}-byte header")
            version, count = _le32(head[4:8]), _le32(head[8:12])
            if version != LLMC_VERSION:
                raise RunError(f"{path}: llm.c header version {version}, expected 1 (uint16 tokens)")
            if count < 1 or LLMC_HEADER + 2 * count != size:
                raise RunError(f"{path}: the llm.c header declares {count} tokens ({LLMC_HEADER + 2 * count} bytes "
                               f"with the header), the file has {size} bytes")
            offset, width = LLMC_HEADER, 2
        elif head[:8] == HDF5_SIGNATURE:
            offset, count, width = _hdf5_layout(path, size)
        else:
            if size % 2:
                raise RunError(f"{path}: {size} bytes is not a whole number of uint16 tokens (nanoGPT's .bin)")
            offset, count, width = 0, size // 2, 2
        f.seek(offset)
        data = f.read(count * width)
    if len(data) != count * width:
        raise RunError(f"{path}: the file shrank while being read")
    return np.frombuffer(data, dtype="<u2" if width == 2 else "<i4").astype(np.int64), offset, width


def _hdf5_layout(path, size):
    """(offset, count, width) of an HDF5 token file's /tokens (src/data/token_file.c hdf5_body)."""
    import h5py
    from momfmm.h5 import require_kind
    from momfmm.h5reader import Reader
    with Reader(path, "token file") as r:
        require_kind(r, "tokens")
        dset = r.open_dataset("/tokens")
        if len(dset.shape) != 1:
            r.fail(f"/tokens must be 1-D, it has {len(dset.shape)} dimensions")
        r.require_integer("/tokens", dset)
        tid, dcpl = dset.id.get_type(), dset.id.get_create_plist()
        width, signed = tid.get_size(), tid.get_sign() != h5py.h5t.SGN_NONE
        if not (width == 2 and not signed) and not (width == 4 and signed):
            r.fail(f"/tokens must be uint16 or int32, not a {'signed' if signed else 'unsigned'} {width}-byte integer")
        if tid.get_order() != h5py.h5t.ORDER_LE:
            r.fail("/tokens must be little-endian")
        if dcpl.get_layout() != h5py.h5d.CONTIGUOUS or dcpl.get_nfilters() != 0:
            r.fail("/tokens is chunked or compressed and cannot be memory-mapped; write it contiguous (h5py: no "
                   "chunks, compression or maxshape)")
        offset, count = dset.id.get_offset(), int(dset.shape[0])
        if count == 0 or offset is None:
            r.fail("/tokens is empty")
    if offset + count * width > size:
        raise RunError(f"{path}: /tokens runs past the end of the file")
    return offset, count, width


def check_ids(path, ids, pieces, offset=0, width=2):
    """RunError for the first id outside [0, pieces) (src/data/corpus.c check_ids)."""
    bad = np.flatnonzero((ids < 0) | (ids >= pieces))
    if len(bad):
        i = int(bad[0])
        raise RunError(f"{path}: token id {int(ids[i])} at token {i} (byte offset {offset + i * width}) is outside "
                       f"the model's {pieces} pieces")


# ---------------------------------------------------------------- commands
def corpus_of(spec, args):
    paths, skipped = documents(spec, args.include, args.exclude)
    for path, why in skipped:
        print(files.escape_controls(f"warning: {path}: {why}; skipped"))
    return paths


def cmd_train(args):
    if not VOCAB_MIN <= args.vocab_size <= VOCAB_MAX:
        raise ArgumentError(f"--vocab-size {args.vocab_size}: must be in [{VOCAB_MIN}, {VOCAB_MAX}] (the 256 byte "
                            "pieces, <unk> and </s> are among them)")
    if args.format != "hdf5" and args.vocab_size > UINT16_PIECES:
        raise ArgumentError(f"--vocab-size {args.vocab_size} with --format {args.format}: uint16 ids hold at most "
                            f"{UINT16_PIECES} pieces; use --format hdf5")
    paths = corpus_of(args.corpus, args)
    evals = corpus_of(args.eval_path, args) if args.eval_path is not None else None
    files.make_directory(args.out, flag="--out")
    import sentencepiece as spm
    model_path = os.path.join(args.out, "tokenizer.model")
    ext = ".h5" if args.format == "hdf5" else ".bin"
    outputs = [model_path] + [os.path.join(args.out, n + ext) for n in ("train", "val")]
    sources = paths + (evals or [])
    for out in outputs:
        files.check_output(out, sources, "--out")
    model = train_model(paths, args.vocab_size, args.type)
    sp = spm.SentencePieceProcessor(model_proto=model)
    files.write_bytes(model_path, model, inputs=sources, flag="--out")
    keys = []
    for name, docs in (("train", paths), ("val", evals)):
        if docs is None:
            continue
        ids = encode_corpus(sp, docs)
        out = os.path.join(args.out, name + ext)
        write_tokens(out, ids, args.format, inputs=sources)
        print(f"{out}: {len(ids)} tokens")
        keys.append(("data.path" if name == "train" else "data.eval_path", out))
    vocab = sp.get_piece_size()
    print(f"{model_path}: {args.type}, {vocab} pieces (byte fallback)")
    keys.append(("data.tokenizer", model_path))
    print("train with: --set data.task=text --set model.vocab_size=%d %s" % (
        vocab, " ".join(f"--set {k}={v}" for k, v in keys)))
    return 0


def cmd_encode(args):
    sp = load_model(args.model)
    paths = corpus_of(args.corpus, args)
    files.check_output(args.out, paths + [args.model], "--out")
    if args.format != "hdf5" and sp.get_piece_size() > UINT16_PIECES:
        raise ArgumentError(f"--format {args.format}: {args.model} has {sp.get_piece_size()} pieces, more than "
                            f"uint16 ids hold; use --format hdf5")
    ids = encode_corpus(sp, paths)
    write_tokens(args.out, ids, args.format, inputs=paths + [args.model])
    print(f"{args.out}: {len(ids)} tokens")
    return 0


def _integer(text):
    try:
        return int(text, 10) if text.strip().lstrip("+-").isdigit() and text.isascii() else None
    except ValueError:
        return None


def cmd_decode(args):
    sp = load_model(args.model)
    pieces = sp.get_piece_size()
    numbers = [_integer(a) for a in args.ids]
    if all(n is not None for n in numbers):
        for text, n in zip(args.ids, numbers):
            if not 0 <= n < pieces:
                raise ArgumentError(f"id {text}: outside the model's {pieces} pieces [0, {pieces})")
        ids = np.asarray(numbers, dtype=np.int64)
    elif len(args.ids) == 1:
        ids, offset, width = read_tokens(args.ids[0])
        check_ids(args.ids[0], ids, pieces, offset, width)
    else:
        bad = next(a for a, n in zip(args.ids, numbers) if n is None)
        raise ArgumentError(f"'{bad}': give one token file or ids (integers), not both or several files")
    sys.stdout.flush()
    sys.stdout.buffer.write(decode_ids(sp, ids))
    sys.stdout.buffer.flush()
    return 0


def cmd_ids(args):
    sp = load_model(args.model)
    print(",".join(str(i) for i in encode_text(sp, args.text)))
    return 0


def parser():
    p = tool.Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=tool.Parser)
    for name in ("train", "encode"):
        s = sub.add_parser(name)
        s.add_argument("corpus", help="a file, directory or comma-separated list, as data.path")
        s.add_argument("--format", choices=("nanogpt", "llmc", "hdf5"), default="nanogpt")
        s.add_argument("--include", default="", help="comma-separated globs, as data.include")
        s.add_argument("--exclude", default="", help="comma-separated globs, as data.exclude")
    t = sub.choices["train"]
    t.add_argument("--vocab-size", type=int, required=True,
                   help=f"pieces, the 256 byte pieces included ({VOCAB_MIN} to {VOCAB_MAX})")
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
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `... | head` ends quietly
    args = parser().parse_args(argv)
    try:
        import sentencepiece  # noqa: F401
    except ImportError:
        return tool.fail(PROG, "needs sentencepiece (Debian: apt-get install python3-sentencepiece; "
                         "tools/install_deps.sh)", 2)
    command = {"train": cmd_train, "encode": cmd_encode, "decode": cmd_decode, "ids": cmd_ids}[args.command]
    return tool.run(PROG, command, args)
