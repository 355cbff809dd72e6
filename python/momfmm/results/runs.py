"""Each suite line's run, and the groups of lines that differ only in train.seed.

A line's run is read through momfmm.rundir.load_run from RUNS/NAME, or from its results digest
DIGESTS/NAME.json (momfmm.digest) when the directory is missing or has not reached the digest's
step. A Group's numbers are the final evals of its finished runs (mean ± sample std over seeds).
"""
import math
import os
import re
import sys

import numpy as np

from momfmm import files
from momfmm.digest import read_digest
from momfmm.fmt import MISSING, config_value, fmt_group
from momfmm.files import RunError
from momfmm.rundir import load_run
from momfmm.results.suite import PROG, attention_label, base_config, setting

LN2 = math.log(2.0)
NOT_RUN = "not run"
NO_EVAL = "no eval yet"  # a partial run stopped before its first eval


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
        if started(path):
            e.error = str(exc)
            print(f"{PROG}: warning: {exc}", file=sys.stderr)
        return
    e.world_size = world_size(e.run)
    read_wall_time(e, os.path.join(path, "train.log"))


def started(path):
    """Whether a run directory holds a checkpoint or a metrics.h5 (a run that started)."""
    try:
        return bool(files.list_checkpoints(path)) or os.path.lexists(os.path.join(path, "metrics.h5"))
    except files.RunError:
        return False


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
    e.digest_read = True
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
    if not os.path.lexists(log):
        return
    starts = exits = 0
    try:
        lines = files.read_input(log, "log").decode("utf-8", "replace").splitlines()
    except files.RunError as exc:
        print(f"{PROG}: warning: {exc}; its wall time is left out", file=sys.stderr)
        return
    for line in lines:
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


def values_at(members, key, step):
    """The finite values of eval metric `key` at eval step `step`, one per run that logged it."""
    out = []
    for e in members:
        steps = [int(s) for s in e.run.eval.get("step", [])]
        if step in steps and key in e.run.eval:
            v = float(e.run.eval[key][steps.index(step)])
            if math.isfinite(v):
                out.append(v)
    return out


def mean_std(vals):
    if not vals:
        return None, None
    arr = np.asarray(vals, float)
    return float(arr.mean()), (float(arr.std(ddof=1)) if len(arr) > 1 else 0.0)


def run_precisions(groups):
    """The train.precision values the groups' runs recorded, sorted."""
    return sorted({e.run.cfg("train.precision", "fp32") or "fp32" for g in groups for e in g.ran})


def precision(group):
    """The train.precision each run of the group recorded; for a group not run yet, its config's."""
    used = run_precisions([group])
    return "/".join(used) if used else (setting(group.first, "train.precision", "fp32") or "fp32")


def precision_summary(groups):
    """One phrase for the section's opening: which precision the runs used."""
    used = run_precisions(groups)
    if not used:
        return "precision as the configs set it (fp32; no run yet)"
    if len(used) == 1:
        return f"{used[0]} in every run (the tables' precision column)"
    return f"precisions {', '.join(used)}: each row's is in its table's precision column"


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
        vals = values_at(self.ran, key, step)
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


class AtStep:
    """A group's seeds at one eval step: the cells and claims that read vals() and finished
    see that eval instead of the last one (ListOps from the short models: step 0, before any
    step at the new length)."""

    def __init__(self, group, step):
        self.group, self.step = group, step

    @property
    def finished(self):
        return self.group.finished

    def vals(self, key):
        return values_at(self.group.counted, key, self.step)

    def cell(self, key, digits=4):
        vals = self.vals(key)
        return fmt_group(vals, key, digits) if vals else self.group.missing()


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


def find(groups, prefix):
    """The first group whose attention label starts with prefix, or None."""
    for g in groups:
        if attention_label(g.first).startswith(prefix):
            return g
    return None
