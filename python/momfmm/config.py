"""A config as the momfmm binary reads it (docs/config.md §6): the INI syntax of src/config/ini.c, the
key table of src/config/config.c (types, defaults, limits, choices), the cross-key checks of
src/config/config_check.c. What a config fixes in a checkpoint is momfmm.schema's.

momfmm.h5 reads every checkpoint's `config_ini` through `parse` and `Config.check`, so the
Python readers accept exactly the configs the binary accepts; tests/python/test_hostile_inputs.py
holds KEYS against the table in the C source. Numbers parse as C's strtoll and strtod do
(decimal integers; decimal, hexadecimal, inf and nan floats), not as Python's int() and float().
Imports nothing of the package.
"""
import math
import os
import re

# Limits at +-BIG are open ends (src/config/config.c).
BIG = 1e18
STEPS_MAX = 2.0 ** 53    # train.steps: steps are stored as doubles in the metric tables
PATH_MAX = 1024          # CONFIG_PATH_MAX: a path value holds at most 1023 bytes
LIST_MAX = 8             # CONFIG_LIST_MAX: names of fmm.kernels
LISTOPS_CLASSES = 10
FMM_KERNELS = "elu|elu_flip|tanh"


class ConfigError(ValueError):
    """A config the binary refuses; str() is its one-line message, naming the origin (a file,
    "config_ini", "--set") and, for a parse error, the line."""


class Key:
    __slots__ = ("section", "name", "type", "default", "min", "max", "choices", "size", "exclusive")

    def __init__(self, section, name, type_, default, lo=0.0, hi=0.0, choices=None, size=PATH_MAX, exclusive=False):
        if type_ == "bool":
            lo, hi = 0, 1  # as the C table has it
        self.section, self.name, self.type, self.default = section, name, type_, default
        self.min, self.max, self.choices, self.size = lo, hi, choices, size
        self.exclusive = exclusive  # (min, max), the LIMIT_NOTES of src/config/config.c

    @property
    def full(self):
        return f"{self.section}.{self.name}"


# src/config/config.c CONFIG_KEYS, row for row: section, name, type, default, min, max, choices.
KEYS = [
    Key("model", "vocab_size", "int", "64", 2, 1 << 24),
    Key("model", "d_model", "int", "64", 2, 1 << 16),
    Key("model", "n_heads", "int", "4", 1, 4096),
    Key("model", "n_layers", "int", "2", 1, 4096),
    Key("model", "d_ff", "int", "256", 1, 1 << 20),
    Key("model", "max_seq_len", "int", "0", 0, 1 << 24),
    Key("model", "rope_base", "double", "10000", 1e-6, BIG),
    Key("model", "causal", "bool", "true"),
    Key("model", "head", "enum", "lm", choices="lm|cls"),
    Key("model", "n_classes", "int", "10", 2, 1 << 20),
    Key("attention", "kind", "enum", "softmax", choices="softmax|fmm"),
    Key("attention", "impl", "enum", "tiled", choices="tiled|dense"),
    Key("momentum", "gamma", "double", "0", -100, 100),
    Key("momentum", "learn_gamma", "bool", "false"),
    Key("momentum", "beta", "double", "0", -1, 1, exclusive=True),
    Key("momentum", "gamma2", "double", "0", -100, 100),
    Key("momentum", "apply_to", "enum", "qk", choices="qk|q"),
    Key("momentum", "placement", "enum", "post_rope", choices="post_rope|pre_rope"),
    Key("momentum", "anchor", "bool", "true"),
    Key("fmm", "bandwidth", "int", "5", 0, 1 << 24),
    Key("fmm", "kernels", "list", "elu", choices=FMM_KERNELS),
    Key("fmm", "eps", "double", "1e-6", 1e-30, BIG),
    Key("fmm", "chunk", "int", "16", 1, 1 << 20),
    Key("data", "task", "enum", "chain", choices="chain|copy|listops|text"),
    Key("data", "seq_len", "int", "64", 1, 1 << 24),
    Key("data", "chain_len", "int", "10", 1, 1 << 24),
    Key("data", "noise", "double", "0", 0, 1),
    Key("data", "chain_len_max", "int", "0", 0, 1 << 24),
    Key("data", "chain_noise", "double", "0", 0, 0.9),
    Key("data", "chain_fillers", "int", "16", 1, 1 << 24),
    Key("data", "eval_chain_len", "int", "0", 0, 1 << 24),
    Key("data", "eval_chain_len_max", "int", "0", 0, 1 << 24),
    Key("data", "path", "string", ""),
    Key("data", "resolved_path", "string", ""),
    Key("data", "eval_fraction", "double", "0.1", 0, 1),
    Key("data", "eval_path", "string", ""),
    Key("data", "resolved_eval_path", "string", ""),
    Key("data", "format", "enum", "auto", choices="auto|bytes|tokens"),
    Key("data", "tokenizer", "string", ""),
    Key("data", "tokenizer_checksum", "string", "", size=32),
    Key("data", "include", "string", ""),
    Key("data", "exclude", "string", ""),
    Key("data", "listops_min_len", "int", "16", 1, 1 << 24),
    Key("data", "listops_max_len", "int", "128", 1, 1 << 24),
    Key("data", "listops_max_depth", "int", "10", 1, 64),
    Key("data", "listops_max_args", "int", "10", 2, 64),
    Key("train", "steps", "int64", "1000", 0, STEPS_MAX),
    Key("train", "batch_size", "int", "16", 1, 1 << 24),
    Key("train", "lr", "double", "1e-3", 0, 1),
    Key("train", "min_lr", "double", "0", 0, 1),
    Key("train", "warmup", "int", "0", 0, 1 << 30),
    Key("train", "schedule", "enum", "cosine", choices="cosine|constant"),
    Key("train", "weight_decay", "double", "0.01", 0, BIG),
    Key("train", "beta1", "double", "0.9", 0, 0.999999),
    Key("train", "beta2", "double", "0.999", 0, 0.999999999),
    Key("train", "adam_eps", "double", "1e-8", 1e-30, BIG),
    Key("train", "grad_clip", "double", "1.0", 0, BIG),
    Key("train", "seed", "int64", "1234", 0, BIG),
    Key("train", "log_interval", "int", "10", 1, 1 << 30),
    Key("train", "eval_interval", "int", "100", 0, 1 << 30),
    Key("train", "eval_batches", "int", "4", 1, 1 << 20),
    Key("train", "eval_readouts", "enum", "auto", choices="auto|true|false"),
    Key("train", "eval_at_start", "bool", "false"),
    Key("train", "ckpt_interval", "int", "0", 0, 1 << 30),
    Key("train", "keep", "int", "3", 1, 1 << 20),
    Key("train", "keep_best", "bool", "false"),
    Key("train", "out_dir", "string", "runs/default"),
    Key("train", "on_nonfinite", "enum", "stop", choices="stop|skip"),
    Key("train", "on_save_failure", "enum", "stop", choices="stop|continue"),
    Key("train", "micro_batch", "int", "0", 0, 1 << 24),
    Key("train", "precision", "enum", "fp32", choices="fp32|bf16"),
    Key("train", "gemm", "enum", "auto", choices="openblas|onednn|auto|avx512"),
    Key("train", "recompute", "enum", "none", choices="none|mlp|block"),
    Key("dist", "bucket_mb", "double", "4", 1e-3, 1e6),
    Key("dist", "overlap", "bool", "true"),
    Key("dist", "check_interval", "int", "100", 0, 1 << 30),
    Key("dist", "zero", "int", "0", 0, 1),
    Key("dist", "collective_io", "bool", "false"),
    Key("dist", "timeout", "double", "300", 1, 1e6),
    Key("dist", "context", "int", "1", 1, 4096),
    Key("dist", "context_scan", "enum", "allgather", choices="allgather|exscan|ring"),
]
KEY_OF = {(k.section, k.name): k for k in KEYS}
SECTIONS = list(dict.fromkeys(k.section for k in KEYS))
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


# ---------------------------------------------------------------- values (src/config/config.c set_value)
_SPACE = " \t\n\v\f\r"  # what strtoll and strtod skip first
_INT = re.compile(r"[ \t\n\v\f\r]*[+-]?[0-9]+", re.ASCII)
_DEC = re.compile(r"[ \t\n\v\f\r]*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)
_HEX = re.compile(r"[ \t\n\v\f\r]*([+-]?)0[xX](([0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)([pP][+-]?[0-9]+)?)",
                  re.ASCII)
_SPECIAL = re.compile(r"[ \t\n\v\f\r]*[+-]?(inf|infinity|nan(\([0-9A-Za-z_]*\))?)", re.ASCII | re.IGNORECASE)


def c_integer(text):
    """strtoll(text, 10) consuming all of text: the int, or None (a syntax error). Values beyond
    the 64-bit range come back as they are: the caller's range check refuses them."""
    return int(text.strip(_SPACE)) if _INT.fullmatch(text) else None


def c_double(text):
    """strtod(text) consuming all of text: (value, huge) where huge says the number lies beyond
    what a double holds (ERANGE: 1e400, 1e-400); None for a syntax error."""
    if _SPECIAL.fullmatch(text):
        return float(text.strip(_SPACE).split("(")[0]), False
    hexa = _HEX.fullmatch(text)
    if hexa:
        try:
            value = float.fromhex(hexa.group(1) + "0x" + hexa.group(2))
        except OverflowError:
            return math.inf, True
        mantissa = hexa.group(3)
        return value, value == 0 and any(c not in "0." for c in mantissa)
    if not _DEC.fullmatch(text):
        return None
    value = float(text.strip(_SPACE))
    mantissa = re.split("[eE]", text.strip(_SPACE))[0]
    return value, math.isinf(value) or (value == 0 and any(c in "123456789" for c in mantissa))


def _choice(choices, value):
    names = choices.split("|")
    return names.index(value) if value in names else -1


def _parse_list(choices, value):
    """fmm.kernels' names (src/config/config.c parse_list): a list of names, or None."""
    out = []
    p = value.lstrip(" \t")
    while p:
        n = p.find(",")
        n = len(p) if n < 0 else n
        name = p[:n].rstrip(" \t")
        if not name or len(name.encode("utf-8", "surrogateescape")) >= 64 or len(out) == LIST_MAX \
                or _choice(choices, name) < 0:
            return None
        out.append(name)
        if n == len(p):
            break
        p = p[n + 1:].lstrip(" \t")
        if not p:
            return None  # a trailing comma names an empty item
    return out


def _range_text(key):
    lo, hi = format_double(key.min), format_double(key.max)
    if key.max >= BIG and key.min <= -BIG:
        return f"must be in [{lo}, {hi}]"
    if key.max >= BIG:
        return f"must be >= {lo} (at most {hi})"
    if key.min <= -BIG:
        return f"must be <= {hi} (at least {lo})"
    return f"must be in ({lo}, {hi})" if key.exclusive else f"must be in [{lo}, {hi}]"


def format_double(x):
    """config_format_double: the fewest digits that read back as x; whole numbers below 1e16
    without an exponent."""
    for digits in range(1, 18):
        text = f"{x:.{digits}g}"
        if math.isnan(x) or float(text) == x:
            break
    if "e" in text and x == math.floor(x) and abs(x) < 1e16:
        text = f"{x:.0f}"
    return text


def shown(value):
    """config_shown: control bytes as \\xNN, cut with "..." after 57 characters of a long value."""
    limit = 60 if len(value) <= 60 else 57
    out = "".join(f"\\x{ord(c):02x}" if ord(c) < 0x20 or ord(c) == 0x7f else c for c in value[:limit])
    return out + ("..." if len(value) > limit else "")


def set_value(key, text):
    """The typed value of `text` for `key`, or raises ConfigError naming the key and the value."""
    v = shown(text)
    kind = key.type
    if kind in ("int", "int64"):
        number = c_integer(text)
        if number is None:
            raise ConfigError(f"{key.full} = '{v}': expected an integer")
        if not INT64_MIN <= number <= INT64_MAX or float(number) < key.min or float(number) > key.max:
            raise ConfigError(f"{key.full} = {v} is out of range: {_range_text(key)}")
        return number
    if kind == "double":
        parsed = c_double(text)
        if parsed is None:
            raise ConfigError(f"{key.full} = '{v}': expected a number")
        number, huge = parsed
        if huge:
            raise ConfigError(f"{key.full} = {v} is out of range: beyond what a double holds ({_range_text(key)})")
        if not math.isfinite(number):
            raise ConfigError(f"{key.full} = '{v}': expected a number")
        if number < key.min or number > key.max or (key.exclusive and number in (key.min, key.max)):
            raise ConfigError(f"{key.full} = {v} is out of range: {_range_text(key)}")
        return number
    if kind == "bool":
        if text in ("true", "1", "yes"):
            return True
        if text in ("false", "0", "no"):
            return False
        raise ConfigError(f"{key.full} = '{v}': expected true or false")
    if kind == "string":
        if len(text.encode("utf-8", "surrogateescape")) >= key.size:
            raise ConfigError(f"{key.full} = '{v}': longer than {key.size - 1} characters")
        return text
    if kind == "enum":
        if _choice(key.choices, text) < 0:
            raise ConfigError(f"{key.full} = '{v}': not one of the allowed values (allowed: {key.choices})")
        return text
    names = _parse_list(key.choices, text)
    if names is None:
        raise ConfigError(f"{key.full} = '{v}': not a list of {key.choices.replace('|', ',')} "
                          f"(at most {LIST_MAX} names)")
    return names


# ---------------------------------------------------------------- quoted values (src/config/ini.c ini_unquote)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', ";": ";", "#": "#"}


def unquote(value):
    """A value as momfmm reads it (docs/config.md §6, escaping): one that starts with '"' is
    quoted, with the escapes \\n \\t \\r \\\\ \\" \\; \\# and \\xNN; any other value is verbatim.
    Bytes that are not UTF-8 come back as surrogate escapes (os.fsencode gives the bytes back).
    Raises ValueError for a malformed quoted value."""
    if not value.startswith('"'):
        return value
    raw, out, i = value.encode("utf-8", "surrogateescape"), bytearray(), 1
    while i < len(raw) and raw[i] != ord('"'):
        if raw[i] != ord("\\"):
            out.append(raw[i])
            i += 1
            continue
        e = chr(raw[i + 1]) if i + 1 < len(raw) else ""
        if e in _ESCAPES and e:
            out += _ESCAPES[e].encode()
            i += 2
        elif e == "x" and re.fullmatch(rb"[0-9a-fA-F]{2}", raw[i + 2:i + 4]) and raw[i + 2:i + 4] != b"00":
            out.append(int(raw[i + 2:i + 4], 16))
            i += 4
        elif e == "":
            raise ValueError("no closing quote")
        else:
            raise ValueError(f"unknown escape \\{shown(e)} (known: \\n \\t \\r \\\\ \\\" \\; \\# \\xNN)")
    if i >= len(raw):
        raise ValueError("no closing quote")
    if raw[i + 1:].strip(b" \t"):
        raise ValueError("text after the closing quote")
    return out.decode("utf-8", "surrogateescape")


# ---------------------------------------------------------------- the INI syntax (src/config/ini.c)
def _strip(s):
    return s.lstrip(" \t").rstrip(" \t\r")


def _comment_start(value):
    """Where a value's comment starts: ';' or '#' after a blank, outside a quoted value."""
    p = len(value) - len(value.lstrip(" \t"))
    if p < len(value) and value[p] == '"':
        p += 1
        while p < len(value) and value[p] != '"':
            p += 2 if value[p] == "\\" and p + 1 < len(value) else 1
        if p >= len(value):
            return None  # no closing quote: unquote reports it
        p += 1
    for i in range(p, len(value)):
        if value[i] in ";#" and i > 0 and value[i - 1] in " \t":
            return i
    return None


def ini_lines(text):
    """(line number, "section", name) and (line number, "pair", key, raw value) and (line
    number, "malformed", text) events of an INI text, as src/config/ini.c's parser calls its handlers."""
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for number, line in enumerate(lines, 1):
        s = _strip(line)
        if not s or s[0] in ";#":
            continue
        if s[0] == "[":
            close = s.find("]")
            rest = _strip(s[close + 1:]) if close >= 0 else None
            if close < 0 or (rest and rest[0] not in ";#"):
                yield number, "malformed", s
            else:
                yield number, "section", _strip(s[1:close])
            continue
        sep = min([i for i in (s.find("="), s.find(":")) if i >= 0], default=-1)
        if sep <= 0:
            yield number, "malformed", s
            continue
        value = s[sep + 1:]
        cut = _comment_start(value)
        yield number, "pair", _strip(s[:sep]), _strip(value if cut is None else value[:cut])


class Config:
    """A parsed config: `raw` {section: {key: value as written (quoted values still quoted)}}
    of the keys set, and `values` {(section, key): typed value} of every key, defaults filled
    in. get("model.d_model") gives a typed value."""

    def __init__(self):
        self.raw = {}
        self.values = {(k.section, k.name): set_value(k, k.default) for k in KEYS}

    def get(self, key):
        section, name = key.split(".", 1)
        return self.values[(section, name)]

    def __getitem__(self, key):
        return self.get(key)

    # ------------------------------------------------------------ src/config/config.c
    def override(self, assignment):
        """One `--set section.key=value` as config_apply_override applies it: blanks around the
        names and the value are not theirs, a quoted value is decoded, and the value replaces the
        file's. Raises ConfigError worded as the binary words it ("--set ...")."""
        eq, dot = assignment.find("="), assignment.find(".")
        if eq < 0 or dot < 0 or dot > eq:
            raise ConfigError(f"--set {shown(assignment)}: expected section.key=value")
        section, name = assignment[:dot].strip(" \t"), assignment[dot + 1:eq].strip(" \t")
        value = assignment[eq + 1:].strip(" \t")
        self.values[(section, name)] = written_value(key_named(section, name, "--set "), value, "--set ")
        self.raw.setdefault(section, {})[name] = value
        return self

    # ------------------------------------------------------------ src/config/config_check.c
    def check(self, origin="config_ini"):
        """config_check: the keys against each other; raises ConfigError naming origin."""
        g = self.get
        d, H = g("model.d_model"), g("model.n_heads")
        fail = ConfigError
        if d % H:
            raise fail(f"{origin}: model.d_model = {d} is not divisible by model.n_heads = {H}")
        if (d // H) % 2:
            raise fail(f"{origin}: model.d_model / model.n_heads = {d // H} is odd; RoPE needs an even head dimension")
        task, head, V, T = g("data.task"), g("model.head"), g("model.vocab_size"), g("data.seq_len")
        if g("model.max_seq_len") > 0 and T > g("model.max_seq_len"):
            raise fail(f"{origin}: data.seq_len = {T} exceeds model.max_seq_len = {g('model.max_seq_len')}")
        if head == "cls" and task != "listops":
            raise fail(f"{origin}: model.head = cls needs data.task = listops")
        if head == "cls" and g("model.n_classes") < LISTOPS_CLASSES:
            raise fail(f"{origin}: model.n_classes = {g('model.n_classes')} is below the {LISTOPS_CLASSES} classes "
                       "of data.task = listops")
        if head == "lm" and task == "listops":
            raise fail(f"{origin}: data.task = listops needs model.head = cls")
        if task == "copy" and V < 11:
            raise fail(f"{origin}: data.task = copy needs model.vocab_size >= 11 (symbols 1..10), got {V}")
        if task == "copy" and T < 4:
            raise fail(f"{origin}: data.task = copy needs data.seq_len >= 4, got {T}")
        if task == "chain":
            self._check_chain(origin)
        if task == "text" and g("data.format") == "bytes" and V != 256:
            raise fail(f"{origin}: data.format = bytes is byte-level and needs model.vocab_size = 256")
        if task != "text" and (g("data.eval_path") or g("data.format") != "auto" or g("data.include")
                               or g("data.exclude") or g("data.tokenizer")):
            raise fail(f"{origin}: data.eval_path, data.format, data.include, data.exclude and data.tokenizer "
                       "are for data.task = text")
        if task == "text" and not g("data.path"):
            raise fail(f"{origin}: data.task = text needs data.path")
        lo, hi = g("data.listops_min_len"), g("data.listops_max_len")
        if task == "listops" and lo > hi:
            raise fail(f"{origin}: data.listops_min_len = {lo} exceeds data.listops_max_len = {hi}")
        if task == "listops" and not g("data.path") and lo > T:
            raise fail(f"{origin}: data.listops_min_len = {lo} exceeds data.seq_len = {T}")
        if g("train.min_lr") > g("train.lr"):
            raise fail(f"{origin}: train.min_lr = {g('train.min_lr'):g} exceeds train.lr = {g('train.lr'):g}")
        lr, wd = g("train.lr"), g("train.weight_decay")
        if lr * wd >= 1:
            raise fail(f"{origin}: train.lr x train.weight_decay = {lr:g} x {wd:g} = {lr * wd:g}: must be below 1, "
                       "else the decoupled decay p -= lr*wd*p flips the weights' sign every step (and past 2 grows "
                       "them without bound)")
        self._check_context(origin)
        return self

    def _check_context(self, origin):
        """check_context of src/config/config_check.c (docs/design.md §8.12)."""
        g = self.get
        C, T = g("dist.context"), g("data.seq_len")
        if C == 1:
            return
        zigzag = g("attention.kind") == "softmax" and g("model.causal")
        chunks = 2 * C if zigzag else C
        shortest = T // chunks
        if shortest < 1:
            raise ConfigError(f"{origin}: data.seq_len = {T} cannot be cut in the {chunks} "
                              f"{'zigzag chunks' if chunks > C else 'shards'} of dist.context = {C}")
        k = g("fmm.bandwidth")
        half = k if k < T else T
        if g("attention.kind") == "fmm" and half - 1 > shortest:
            raise ConfigError(f"{origin}: fmm.bandwidth = {k} needs the {half - 1} keys before each shard from one "
                              f"neighbour, more than the {shortest} positions of the shortest shard (data.seq_len / "
                              "dist.context): lower fmm.bandwidth or dist.context")
        if g("attention.kind") == "softmax" and g("attention.impl") == "dense":
            raise ConfigError(f"{origin}: dist.context = {C} runs softmax as ring attention on the tiled kernel: "
                              "attention.impl = dense keeps T x T probabilities, use attention.impl = tiled")
        if g("train.eval_readouts") == "true":
            raise ConfigError(f"{origin}: train.eval_readouts = true needs whole sequences on a rank (the read-outs "
                              f"pair positions of every shard): dist.context = {C}; use auto or false, and eval the "
                              "checkpoint afterwards")

    def _check_chain(self, origin):
        g = self.get
        L, L_max = g("data.chain_len"), g("data.chain_len_max")
        E, E_max = g("data.eval_chain_len"), g("data.eval_chain_len_max")
        if 0 < L_max < L:
            raise ConfigError(f"{origin}: data.chain_len_max = {L_max} is below data.chain_len = {L}")
        if 0 < E_max < E:
            raise ConfigError(f"{origin}: data.eval_chain_len_max = {E_max} is below data.eval_chain_len = {E} "
                              "(0 = no length eval)")
        V, fillers = g("model.vocab_size"), g("data.chain_noise") > 0
        if fillers and g("data.chain_fillers") >= V:
            raise ConfigError(f"{origin}: data.chain_fillers = {g('data.chain_fillers')} leaves no chain token of "
                              f"model.vocab_size = {V}")
        tokens = V - g("data.chain_fillers") if fillers else V
        for name, value in (("chain_len", L), ("chain_len_max", L_max), ("eval_chain_len", E),
                            ("eval_chain_len_max", E_max)):
            if value > tokens:
                raise ConfigError(f"{origin}: data.{name} = {value} exceeds the {tokens} chain tokens of "
                                  f"model.vocab_size = {V}{' less data.chain_fillers' if fillers else ''} "
                                  "(tokens must be distinct)")

    def resolve_data_path(self, origin="config_ini"):
        """config_resolve_data_path keeping a recorded resolved path: data.path (and
        data.eval_path) made absolute against the current directory where the config has no
        resolved_path; raises ConfigError when that is longer than a path value holds."""
        for given, resolved in (("path", "resolved_path"), ("eval_path", "resolved_eval_path")):
            if self.values[("data", resolved)] or not self.values[("data", given)]:
                continue
            cwd = os.getcwd()
            items = [item if not item or item.startswith("/") else f"{cwd}/{item}"
                     for item in self.values[("data", given)].split(",")]
            joined = ",".join(items)
            if len(joined.encode("utf-8", "surrogateescape")) >= PATH_MAX:
                raise ConfigError(f"{origin}: data.{given} = {shown(self.values[('data', given)])}: as an "
                                  f"absolute path it is longer than {PATH_MAX - 1} characters")
            self.values[("data", resolved)] = joined
        return self

    # ------------------------------------------------------------ what the config fixes
    @property
    def momentum_on(self):
        """docs/model.md §1.2: gamma != 0 or learn_gamma."""
        return self.get("momentum.gamma") != 0.0 or self.get("momentum.learn_gamma")

    @property
    def positions(self):
        """The RoPE table's length: max(model.max_seq_len, data.seq_len)."""
        return max(self.get("model.max_seq_len"), self.get("data.seq_len"))


def key_named(section, name, prefix):
    """The Key of section.name, or ConfigError "PREFIXunknown ..." (prefix: where it was written,
    "FILE:LINE: " or "--set ")."""
    key = KEY_OF.get((section, name))
    if key is None:
        if section not in SECTIONS:
            raise ConfigError(f"{prefix}unknown section [{section}] (key {shown(name)})")
        raise ConfigError(f"{prefix}unknown key {section}.{shown(name)}")
    return key


def written_value(key, value, prefix):
    """The typed value of `value` as written in a file or --set (a quoted one decoded), or
    ConfigError prefixed by where it was written."""
    try:
        text = unquote(value)
    except ValueError as exc:
        raise ConfigError(f"{prefix}{key.full} = {shown(value)}: bad quoted value: {exc}") from None
    try:
        return set_value(key, text)
    except ConfigError as exc:
        raise ConfigError(f"{prefix}{exc}") from None


def parse(text, origin="config_ini"):
    """A Config from INI text with momfmm's syntax and checks of each key (not the cross-key
    checks: Config.check). Raises ConfigError "origin:line: message"."""
    c = Config()
    section, key_line, section_line = None, {}, {}
    for event in ini_lines(text):
        number, kind = event[0], event[1]
        where = f"{origin}:{number}"
        if kind == "malformed":
            raise ConfigError(f"{where}: malformed line (expected [section] or key = value): {shown(event[2])}")
        if kind == "section":
            section = event[2]
            if section in SECTIONS:
                if section in section_line:
                    raise ConfigError(f"{where}: duplicate section [{section}] (first at line "
                                      f"{section_line[section]})")
                section_line[section] = number
            continue
        name, value = event[2], event[3]
        if section is None:
            raise ConfigError(f"{where}: key {shown(name)} is outside any [section]")
        key = key_named(section, name, f"{where}: ")
        if (section, name) in key_line:
            raise ConfigError(f"{where}: duplicate key {key.full} (first set at line {key_line[(section, name)]})")
        key_line[(section, name)] = number
        c.values[(section, name)] = written_value(key, value, f"{where}: ")
        c.raw.setdefault(section, {})[name] = value
    return c
