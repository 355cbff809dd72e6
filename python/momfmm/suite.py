"""The experiment suite (configs/experiments/suite.list) and its runs, for the results report.

One suite line is NAME CONFIG [--set section.key=value ...]; run NAME lives in RUNS/NAME
(tools/run_experiments.sh). This module parses the suite, reads each run's HDF5 files through
momfmm.h5.load_run, groups the lines of one configuration (lines that differ only in
train.seed), and judges the seeds' claims on the groups' numbers (mean ± sample std over
seeds). momfmm.results writes RESULTS.md from it; tests/e2e reuse parse_suite.
"""
import configparser
import math
import os
import re
import sys

import numpy as np

from momfmm.fmt import MISSING, config_value, fmt_group, shortest
from momfmm.digest import read_digest
from momfmm.h5 import RunError, load_run


def repository_root():
    """The repository whose configs/ the suite's paths are relative to: the source tree holding
    this package (python/momfmm/ sits two levels below the root, docs/design.md §8.8), else, for
    an installed package, the current directory."""
    source_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return source_root if os.path.isdir(os.path.join(source_root, "configs")) else os.getcwd()


ROOT = repository_root()
PROG = "momfmm_report.py"
LN2 = math.log(2.0)
NOT_RUN = "not run"
NO_EVAL = "no eval yet"  # a partial run stopped before its first eval

NOISE_SE = 2.0          # a difference below NOISE_SE standard errors is "within seed noise"
SAME_TOL = 0.02         # "about unchanged": relative difference within 2 %


# ---------------------------------------------------------------- the suite
class Entry:
    """One suite line: NAME CONFIG [--set section.key=value ...]."""

    def __init__(self, name, config, sets, lineno, text):
        self.name, self.config, self.sets, self.lineno, self.text = name, config, sets, lineno, text
        self.run = None       # momfmm.h5.Run, when the run directory has files
        self.error = None     # why the run could not be read
        self.world_size = None
        self.wall_s = None    # wall time from train.log ("# exit RC after N s"), if logged
        self.wall_unlogged = 0  # starts in train.log without an exit line (their time is not in wall_s)
        self.from_digest = False  # the run was read from its results digest (momfmm.digest)

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
    entries, names = [], {}
    with open(path) as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            words = line.split()
            if len(words) < 2:
                raise SystemExit(f"{PROG}: error: {path}:{lineno}: expected 'NAME CONFIG [--set k=v ...]'")
            name, config, rest = words[0], words[1], words[2:]
            if name in names:
                raise SystemExit(f"{PROG}: error: {path}:{lineno}: run name '{name}' repeats line {names[name]}")
            names[name] = lineno
            try:
                sets = parse_overrides(rest)
            except ValueError as exc:
                raise SystemExit(f"{PROG}: error: {path}:{lineno}: {exc}") from None
            entries.append(Entry(name, config, sets, lineno, line))
    return entries


_config_cache = {}


def base_config(path):
    if path not in _config_cache:
        cp = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=(";", "#"))
        full = os.path.join(ROOT, path)
        if os.path.exists(full):
            cp.read(full)
        _config_cache[path] = cp
    return _config_cache[path]


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
    if base == "chain_seed":  # the seed-scale families (momfmm.seed_scale): L sweep and R runs
        return ("seed_R", None) if entry.name.startswith("chain_seed_R_") else ("chain_seed", None)
    if base == "text_seed":
        return ("text_seed", None)
    m = re.match(r"chain_L(\d+)$", base)
    if m:
        return ("chain", int(m.group(1)))
    m = re.match(r"copy_T(\d+)$", base)
    if m:
        return ("copy", int(m.group(1)))
    if base.startswith("listops"):
        return ("listops", None)
    if base.startswith("text"):
        return ("text", None)
    return ("other", base)


def attention_label(entry):
    """softmax / linear / band only / FMM 1 kernel / FMM 2 kernels, + momentum."""
    kind = setting(entry, "attention.kind", "softmax")
    gamma = float(setting(entry, "momentum.gamma", "0") or 0)
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


def momentum_label(entry):
    gamma = float(setting(entry, "momentum.gamma", "0") or 0)
    parts = [f"γ={shortest(gamma)}"]
    if setting(entry, "momentum.anchor", "true").lower() in ("false", "0", "no", "off"):
        parts.append("unanchored")
    if setting(entry, "momentum.placement", "post_rope") == "pre_rope":
        parts.append("pre_rope")
    return ", ".join(parts)


# ---------------------------------------------------------------- loading
def load_entries(entries, runs_dir, digests=None):
    """Each entry's run from RUNS/NAME, or from its results digest DIGESTS/NAME.json
    (momfmm.digest) when the directory is missing or has not reached the digest's step."""
    for e in entries:
        path = os.path.join(runs_dir, e.name)
        if os.path.isdir(path):
            load_directory(e, path)
        if digests is not None:
            load_digest(e, os.path.join(digests, e.name + ".json"))


def load_directory(e, path):
    try:
        e.run = load_run(path, label=e.name)
    except RunError as exc:
        if any(f.endswith(".h5") for f in os.listdir(path)):
            e.error = str(exc)
            print(f"{PROG}: warning: {exc}", file=sys.stderr)
        return
    e.world_size = world_size(e.run)
    read_wall_time(e, os.path.join(path, "train.log"))


def world_size(run):
    """The ranks a run was made with (root attribute world_size), None when absent or not a count."""
    try:
        return int(run.attrs.get("world_size", 0)) or None
    except (TypeError, ValueError, OverflowError):
        return None


def load_digest(e, path):
    if not os.path.exists(path):
        return
    try:
        run, wall_s, unlogged = read_digest(path, name=e.name)
    except RunError as exc:
        print(f"{PROG}: warning: {exc}", file=sys.stderr)
        return
    if e.run is not None and e.run.step >= run.step:
        return  # the run directory is as far on as the digest, or further
    e.run, e.error, e.from_digest = run, None, True
    e.world_size = world_size(run)
    e.wall_s, e.wall_unlogged = wall_s, unlogged


def read_wall_time(e, log):
    """Wall time from the lines tools/run_experiments.sh writes around each start of a run
    ("# <date> <uptime>" ... "# exit RC after N s"; a resumed run has several): the sum over
    the starts that logged an exit, and how many starts did not (killed with their session,
    so the sum is a lower bound)."""
    if not os.path.exists(log):
        return
    starts = exits = 0
    with open(log, errors="replace") as f:
        for line in f:
            m = re.match(r"# exit -?\d+ after (\d+) s", line)
            if m:
                e.wall_s = (e.wall_s or 0) + int(m.group(1))
                exits += 1
            elif re.match(r"# \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d ", line):
                starts += 1
    e.wall_unlogged = max(starts - exits, 0)


# docs/config.md §6 defaults of the keys that tell the suite's variants apart.
DOCUMENTED_DEFAULTS = {"attention.kind": "softmax", "momentum.gamma": "0", "momentum.learn_gamma": "false",
                 "momentum.beta": "0", "momentum.gamma2": "0", "momentum.apply_to": "qk",
                 "momentum.placement": "post_rope", "momentum.anchor": "true"}


def _same(a, b):
    a, b = (a or "").strip(), (b or "").strip()
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    except ValueError:
        return a.lower() == b.lower()


def _show(v):
    return config_value(v) or "(empty)"


def mismatches(e):
    """Keys where the run's stored config differs from its suite line (a stale run directory,
    or a run made with extra overrides): the line's overrides and the config file's
    model, attention, momentum, fmm and data keys."""
    if e.run is None or not e.run.has_config:
        return []
    keys = [k for k, _ in e.sets]
    cp = base_config(e.config)
    for section in ("model", "attention", "momentum", "fmm", "data"):
        if cp.has_section(section):
            keys += [f"{section}.{k}" for k in cp.options(section) if f"{section}.{k}" not in keys]
    keys += [k for k in DOCUMENTED_DEFAULTS if k not in keys]
    out = []
    for key in keys:
        want, have = setting(e, key, DOCUMENTED_DEFAULTS.get(key, "")), e.run.cfg(key)
        if have is not None and not _same(want, have):
            out.append(f"{key} {_show(have)} vs {_show(want)}")
    return out


def target_steps(e):
    if e.run is not None and e.run.has_config:
        try:
            return int(float(e.run.cfg("train.steps", "0")))
        except ValueError:
            pass
    try:
        return int(setting(e, "train.steps", "0"))
    except ValueError:
        return 0


def complete(e):
    return e.run is not None and e.run.step >= target_steps(e) > 0


def builds_text(entries):
    """Which builds wrote the runs' newest checkpoints (root attribute momfmm_version,
    docs/files.md §4), with run counts; older files do not record it."""
    counts = {}
    for e in entries:
        if e.run is not None:
            value = e.run.attrs.get("momfmm_version")
            build = "" if value is None else str(value)  # a file's text: any type, shown as it is
            counts[build] = counts.get(build, 0) + 1
    if not counts:
        return "none (no run yet)"
    named = [f"{b} ({n} run{'s' if n != 1 else ''})" for b, n in sorted(counts.items()) if b]
    if "" in counts:
        n = counts[""]
        named.append(f"not recorded ({n} run{'s' if n != 1 else ''}, checkpoints of builds before the "
                     "attribute; their train.log names the binary)")
    return "; ".join(named)


def final(e, key):
    """Final eval value of a metric for one run (bpb derived from loss), None if absent."""
    if e.run is None:
        return None
    if key == "bpb":
        v = e.run.final_eval("loss")
        return None if v is None else v / LN2
    return e.run.final_eval(key)


def values(members, key):
    out = []
    for e in members:
        v = final(e, key)
        if v is not None and math.isfinite(v):
            out.append(v)
    return out


def mean_std(vals):
    if not vals:
        return None, None
    arr = np.asarray(vals, float)
    return float(arr.mean()), (float(arr.std(ddof=1)) if len(arr) > 1 else 0.0)


# ---------------------------------------------------------------- groups
class Group:
    def __init__(self, members):
        self.members = members
        self.first = members[0]

    @property
    def ran(self):
        return [e for e in self.members if e.run is not None]

    @property
    def done(self):
        return [e for e in self.ran if complete(e)]

    @property
    def finished(self):
        """True when a run of the group reached its steps: only then do claims judge it."""
        return bool(self.done)

    @property
    def counted(self):
        """The runs whose last eval the tables show: the finished ones; a group with none
        finished yet shows its partial runs, and its status says so. A partial run beside a
        finished one stays out of the means (its last eval is from an earlier step)."""
        return self.done or self.ran

    def vals(self, key):
        return values(self.counted, key)

    def cell(self, key, digits=4):
        vals = self.vals(key)
        return fmt_group(vals, key, digits) if vals else self.missing()

    def mean(self, key):
        return mean_std(self.vals(key))[0]

    def mean_at(self, key, step):
        """Mean over the seeds of eval metric `key` at eval step `step` (None if no seed has a
        finite value there)."""
        vals = []
        for e in self.ran:
            steps = [int(s) for s in e.run.eval.get("step", [])]
            if step in steps and key in e.run.eval:
                v = float(e.run.eval[key][steps.index(step)])
                if math.isfinite(v):
                    vals.append(v)
        return float(np.mean(vals)) if vals else None

    def status(self):
        """'3/3', or 'not run', or '2/3; partial, not in the means: NAME at step 150/400'."""
        n = len(self.members)
        ran = self.ran
        if not ran:
            errors = [e for e in self.members if e.error]
            return NOT_RUN + (f" ({errors[0].error})" if errors else "")
        done = self.done
        text = f"{len(done)}/{n}"
        bad = [e for e in self.members if e.error]
        if bad:
            text += "; unreadable: " + ", ".join(f"{e.name} ({e.error})" for e in bad)
        odd = [(e, mismatches(e)) for e in ran]
        odd = [(e, m) for e, m in odd if m]
        if odd:
            text += "; ⚠ run differs from its suite line: " + ", ".join(
                f"{e.name} ({'; '.join(m[:3])}{'; …' if len(m) > 3 else ''})" for e, m in odd)
        partial = [e for e in ran if e not in done]
        if partial:
            text += "; partial" + (", not in the means" if done else "") + ": " + ", ".join(
                f"{e.name} at step {e.run.step}/{target_steps(e)}" for e in partial)
        return text

    def missing(self):
        """What a table cell shows when the group has no value: not run, no eval yet (only
        partial runs stopped before their first eval), or — (the runs do not log it)."""
        if not self.ran:
            return NOT_RUN
        return NO_EVAL if not any(len(e.run.eval.get("step", [])) for e in self.ran) else MISSING

    def steps(self):
        steps = sorted({e.run.step for e in self.counted})
        return "/".join(map(str, steps)) if steps else "—"

    def only_regex(self):
        names = [e.name for e in self.members]
        stems = {re.sub(r"_s\d+$", "", n) for n in names}
        if len(stems) == 1 and all(re.search(r"_s\d+$", n) for n in names) and len(names) > 1:
            return f"^{re.escape(stems.pop())}_s[0-9]+$"
        if len(names) == 1:
            return f"^{re.escape(names[0])}$"
        return "^(" + "|".join(re.escape(n) for n in names) + ")$"


def eval_steps(groups, most=None):
    """The eval steps any run of the groups logged, sorted; with `most`, thinned to at most
    that many, evenly spaced, keeping the first and the last."""
    steps = sorted({int(s) for g in groups if g is not None for e in g.ran for s in e.run.eval.get("step", [])})
    if most and len(steps) > most:
        steps = [steps[i] for i in sorted(set(np.linspace(0, len(steps) - 1, most).round().astype(int)))]
    return steps


def group_entries(entries):
    groups, order = {}, []
    for e in entries:
        if e.key not in groups:
            groups[e.key] = []
            order.append(e.key)
        groups[e.key].append(e)
    return [Group(groups[k]) for k in order]


# ---------------------------------------------------------------- claims
def fmt_pair(vals):
    return fmt_group(vals, "", 4) + f" (n={len(vals)})"


def claim_sides(text, ga, gb, metric):
    """(a, b, None): the per-seed values of both groups; or (None, None, verdict) when a
    side has no suite line or no finished run, so the claim cannot be judged."""
    if ga is None or gb is None:
        return None, None, ("not run", f"{text}: not run (no suite line)")
    a, b = ga.vals(metric), gb.vals(metric)
    if not a or not b:
        return None, None, ("not run", f"{text}: not run yet")
    if not (ga.finished and gb.finished):
        return None, None, ("not run", f"{text}: not judged yet (no finished run on one side, only partial ones)")
    return a, b, None


def less_claim(text, ga, gb, metric, flip=False):
    """Claim: mean metric of ga < mean of gb (flip: the claim is stated as gb > ga, which is
    the same test; values are printed as claimed-side first)."""
    a, b, missing = claim_sides(text, ga, gb, metric)
    if missing:
        return missing
    held = np.mean(a) < np.mean(b)
    note, noisy = noise_note(a, b)
    first, second = (b, a) if flip else (a, b)
    if noisy:
        verdict = "within noise"
        shown = (f"**not shown**: the means go {'the claimed way' if held else 'the other way'}, "
                 "but by less than the seed-to-seed noise")
    else:
        verdict = "held" if held else "did not hold"
        shown = f"**{verdict}**"
    return (verdict, f"{text}: {shown} ({fmt_pair(first)} vs {fmt_pair(second)}){note}")


def no_worse_claim(text, ga, gb, metric):
    """Claim: ga's mean metric is not above gb's ("no degradation"): held when it is lower or
    higher by less than the seed noise (NOISE_SE standard errors; the line says which), did not
    hold when higher by more. With a single seed on a side, a higher mean does not hold."""
    a, b, missing = claim_sides(text, ga, gb, metric)
    if missing:
        return missing
    note, noisy = noise_note(a, b)
    worse = np.mean(a) > np.mean(b)
    verdict = "did not hold" if worse and not noisy else "held"
    how = ("higher, within seed noise" if worse else "not higher") if verdict == "held" else "higher beyond seed noise"
    rel = (np.mean(a) - np.mean(b)) / max(abs(np.mean(b)), 1e-12)
    return (verdict, f"{text}: **{verdict}** ({how}: {fmt_pair(a)} vs {fmt_pair(b)}, {rel:+.2%}){note}")


def same_claim(text, ga, gb, metric):
    """Claim: the means of ga and gb agree within SAME_TOL relative."""
    a, b, missing = claim_sides(text, ga, gb, metric)
    if missing:
        return missing
    rel = abs(np.mean(a) - np.mean(b)) / max(abs(np.mean(b)), 1e-12)
    verdict = "held" if rel <= SAME_TOL else "did not hold"
    return (verdict, f"{text}: **{verdict}** ({fmt_pair(a)} vs {fmt_pair(b)}, {rel:.1%} apart)")


def close_claim(text, ga, gb, metric, tol):
    """Claim: the means of ga and gb agree within tol (absolute)."""
    a, b, missing = claim_sides(text, ga, gb, metric)
    if missing:
        return missing
    d = np.mean(a) - np.mean(b)
    verdict = "held" if abs(d) <= tol else "did not hold"
    return (verdict, f"{text}: **{verdict}** ({fmt_pair(a)} vs {fmt_pair(b)}, difference {d:+.4f})")


def noise_note(a, b):
    """(note, within_noise): the difference of means against NOISE_SE standard errors."""
    if len(a) < 2 or len(b) < 2:
        return " — single seed on at least one side, no spread to judge noise", False
    se = math.sqrt(np.var(a, ddof=1) / len(a) + np.var(b, ddof=1) / len(b))
    diff = abs(np.mean(a) - np.mean(b))
    if diff < NOISE_SE * se:
        return f" — |Δ| = {diff:.4f} < {shortest(NOISE_SE)} s.e. = {NOISE_SE * se:.4f}", True
    return f" — beyond seed noise (|Δ| = {diff:.4f} ≥ {shortest(NOISE_SE)} s.e. = {NOISE_SE * se:.4f})", False


VARIANT_ORDER = ["softmax", "linear", "band only", "FMM (band 5, 1 kernel", "FMM (band 5, 2 kernels",
                 "momentum softmax", "momentum-FMM"]


def variant_rank(label):
    for i, prefix in enumerate(VARIANT_ORDER):
        if label.startswith(prefix):
            return i
    return len(VARIANT_ORDER)


def find(groups, prefix):
    for g in groups:
        if attention_label(g.first).startswith(prefix):
            return g
    return None
