"""The experiment suite (configs/experiments/suite.list): its lines, their settings and labels.

One suite line is NAME CONFIG [--set section.key=value ...] [--init SOURCE]; run NAME lives
in RUNS/NAME (tools/run_experiments.sh), and with --init it starts from the final checkpoint of
SOURCE, an earlier line. Lines that differ only in train.seed are one configuration
(momfmm.results.runs groups them). Paths in the suite are relative to the repository root,
repository_root(). tests/e2e reuse parse_suite.
"""
import os
import re

from momfmm import config as settings
from momfmm import files
from momfmm.fmt import shortest
from momfmm.h5 import config_parser
from momfmm.results.errors import ReportError

PROG = "momfmm_report.py"


def repository_root():
    """The repository whose configs/ the suite's paths are relative to: the source tree holding
    this package (python/momfmm/results/ sits three levels below the root, docs/design.md §8.8;
    an installed share/momfmm the same), else, for a package installed elsewhere, the current
    directory."""
    here = os.path.dirname(os.path.abspath(__file__))
    source_root = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    return source_root if os.path.isdir(os.path.join(source_root, "configs")) else os.getcwd()


def default_suite():
    return os.path.join(repository_root(), "configs", "experiments", "suite.list")


class Entry:
    """One suite line: NAME CONFIG [--set section.key=value ...] [--init SOURCE]."""

    def __init__(self, name, config, sets, lineno, text, init=None):
        self.name, self.config, self.sets, self.lineno, self.text = name, config, sets, lineno, text
        self.init = init      # SOURCE of --init SOURCE: the earlier line whose final checkpoint it starts from
        self.run = None       # momfmm.rundir.Run, when the run directory has files
        self.error = None     # why the run could not be read
        self.world_size = None
        self.wall_s = None    # wall time from train.log ("# exit RC after N s"), if logged
        self.wall_unlogged = 0  # starts in train.log without an exit line (their time is not in wall_s)
        self.from_digest = False  # the run was read from its results digest (momfmm.digest)
        self.digest_read = False  # a results digest of the line was read (used or not)

    @property
    def key(self):
        """The configuration: config file and overrides without train.seed."""
        return (self.config, tuple((k, v) for k, v in self.sets if k != "train.seed"))

    @property
    def seed(self):
        for k, v in self.sets:
            if k == "train.seed":
                return v
        return None


def parse_overrides(words):
    """[(section.key, value)] of override words `--set section.key=value ...`: the one syntax
    of suite lines, of jobs/sweep.sbatch's sweep lines and of momfmm train (docs/cli.md §5).
    Raises ValueError naming the first word that does not fit."""
    sets = []
    for i in range(0, len(words), 2):
        pair = words[i + 1] if i + 1 < len(words) else ""
        key = pair.split("=", 1)[0]
        if words[i] != "--set" or "=" not in pair or "." not in key:
            raise ValueError(f"expected '--set section.key=value' at '{words[i]}'")
        sets.append(tuple(pair.split("=", 1)))
    return sets


def parse_suite(path):
    """[Entry] of the suite file; raises ReportError naming the line that does not parse."""
    entries, names = [], {}
    text = files.read_input(path, "suite list").decode("utf-8", "surrogateescape")
    for lineno, raw in enumerate(text.replace("\r\n", "\n").replace("\r", "\n").split("\n"), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        words = line.split()
        if len(words) < 2:
            raise ReportError(f"{path}:{lineno}: expected 'NAME CONFIG [--set k=v ...] [--init SOURCE]'")
        name, config, rest = words[0], words[1], words[2:]
        if name in names:
            raise ReportError(f"{path}:{lineno}: run name '{name}' repeats line {names[name]}")
        names[name] = lineno
        rest, init = split_init(rest)
        if init is not None and "--init" in rest[::2]:
            raise ReportError(f"{path}:{lineno}: --init given twice (a run starts from one checkpoint)")
        if init is not None and (init not in names or init == name):
            raise ReportError(f"{path}:{lineno}: --init {init}: names no earlier line "
                              "(a line starts from the final checkpoint of one above it)")
        try:
            sets = parse_overrides(rest)
        except ValueError as exc:
            raise ReportError(f"{path}:{lineno}: {exc}") from None
        entries.append(Entry(name, config, sets, lineno, line, init))
    return entries


def split_init(words):
    """(the words without `--init SOURCE`, SOURCE or None): the one suite-line option that is
    not an override."""
    for i in range(0, len(words) - 1, 2):
        if words[i] == "--init":
            return words[:i] + words[i + 2:], words[i + 1]
    return words, None


_config_cache = {}


def base_config(path):
    """The config file of a suite line (relative to the repository root), parsed once as momfmm
    parses it (momfmm.config; quoted values decoded); empty when the file is missing. Raises
    ReportError naming a line the binary would refuse, RunError for a file that is not a
    regular file."""
    full = os.path.join(repository_root(), path)
    if full not in _config_cache:
        cp = config_parser()
        if os.path.lexists(full):
            text = files.read_input(full, "config").decode("utf-8", "surrogateescape")
            try:
                cp.read_dict(settings.parse(text, path).raw)
            except settings.ConfigError as exc:
                raise ReportError(str(exc)) from None
        _config_cache[full] = cp
    return _config_cache[full]


def setting(entry, key, default=""):
    """Value of section.key for a suite line: its override, else its config file's value,
    else default."""
    for k, v in entry.sets:
        if k == key:
            return v
    section, name = key.split(".", 1)
    return base_config(entry.config).get(section, name, fallback=default).strip()


def family_of(entry):
    base = os.path.basename(entry.config)
    base = re.sub(r"(_full)?\.ini$", "", base)
    if base == "chain_seed":  # the reference-scale families (momfmm.results.reference_scale): L sweep and R runs
        return ("chain_seed_R", None) if entry.name.startswith("chain_seed_R_") else ("chain_seed", None)
    if base == "text_seed":
        return ("text_seed", None)
    if base.startswith("chain_recall"):  # momfmm.results.recall: the chain tasks that need content
        return ("recall", {"chain_recall": "varL"}.get(base, base[len("chain_recall_"):]))
    m = re.match(r"chain_L(\d+)$", base)
    if m:
        return ("chain", int(m.group(1)))
    m = re.match(r"copy_T(\d+)$", base)
    if m:
        return ("copy", int(m.group(1)))
    m = re.match(r"listops_ft_T(\d+)$", base)
    if m:  # listops_ft_T2000.ini: LRA's length, from the short-expression models (--init)
        return ("listops_ft", int(m.group(1)))
    m = re.match(r"listops(?:_T(\d+))?$", base)
    if m:  # listops.ini's short expressions (None), listops_T2000.ini at LRA's length (2000)
        return ("listops", int(m.group(1)) if m.group(1) else None)
    if base.startswith("text"):
        return ("text", None)
    return ("other", base)


def gamma_of(entry):
    """momentum.gamma of a suite line, as a number."""
    return float(setting(entry, "momentum.gamma", "0") or 0)


def attention_label(entry):
    """softmax / linear / band only / FMM 1 kernel / FMM 2 kernels, + momentum."""
    kind = setting(entry, "attention.kind", "softmax")
    gamma = gamma_of(entry)
    if kind == "fmm":
        bw = int(setting(entry, "fmm.bandwidth", "5") or 0)
        kernels = [k for k in setting(entry, "fmm.kernels", "elu").split(",") if k.strip()]
        if bw == 0:
            label = f"linear ({','.join(kernels)})"
        elif not kernels:
            label = f"band only (band {bw})"
        else:
            label = f"FMM (band {bw}, {len(kernels)} kernel{'s' if len(kernels) > 1 else ''}: {','.join(kernels)})"
    else:
        label = "softmax"
    if gamma != 0:
        label = ("momentum-" + label if kind == "fmm" else "momentum softmax") + f", γ={shortest(gamma)}"
    return label


def unanchored(entry):
    return setting(entry, "momentum.anchor", "true").lower() in ("false", "0", "no", "off")


def pre_rope(entry):
    return setting(entry, "momentum.placement", "post_rope") == "pre_rope"


def momentum_label(entry):
    parts = [f"γ={shortest(gamma_of(entry))}"]
    if unanchored(entry):
        parts.append("unanchored")
    if pre_rope(entry):
        parts.append("pre_rope")
    return ", ".join(parts)


VARIANT_ORDER = ["softmax", "linear", "band only", "FMM (band 5, 1 kernel", "FMM (band 5, 2 kernels",
                 "momentum softmax", "momentum-FMM"]


def variant_rank(label):
    for i, prefix in enumerate(VARIANT_ORDER):
        if label.startswith(prefix):
            return i
    return len(VARIANT_ORDER)
