"""Small checkpoints for the Python tests, written with h5py in the layout of docs/files.md §4 as
the momfmm binary would accept them (the readers of momfmm.h5 run the binary's checks): every
root attribute, the config's tensors (momfmm.schema.model_tensors) and buffers, and the metric
tables with all the columns of the config's task (those a test does not give hold NaN, as
unmeasured values do). Imported by the tests beside it (pytest puts this directory on the path)."""
import h5py
import numpy as np

from momfmm import config as settings
from momfmm import schema


def write_checkpoint(path, ini, step, train=None, evals=None, attrs=None, seed=0):
    """Writes a checkpoint of the config `ini` (INI text) at `step`. train, evals: {column:
    values} of /metrics/train and /metrics/eval (each needs "step"; None: no table); attrs:
    root attributes to add or replace. Returns path."""
    c = settings.parse(ini).check()
    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        f.attrs["format"] = "momfmm-checkpoint"
        f.attrs["format_version"] = np.int32(1)
        f.attrs["step"] = np.int64(step)
        f.attrs["tokens_seen"] = np.int64(step * 64)
        f.attrs["world_size"] = np.int32(1)
        f.attrs["config_ini"] = ini
        for name, value in (attrs or {}).items():
            f.attrs[name] = value
        for name, shape in schema.model_tensors(c):
            if name.endswith("momentum_gamma"):
                value = np.full(shape, c.get("momentum.gamma"), np.float32)
            elif name.endswith("weight") and "ln" in name:
                value = np.ones(shape, np.float32)
            else:
                value = (0.02 * rng.standard_normal(shape)).astype(np.float32)
            f[f"model/{name}"] = value
        for name, shape in schema.buffer_tensors(c):
            f[f"buffers/{name}"] = np.zeros(shape, np.float32)
        for split, given in (("train", train), ("eval", evals)):
            if given is None:
                continue
            rows = len(given["step"])
            for col in schema.metric_columns(c, split):
                if col.name in given:
                    data = np.asarray(given[col.name], np.int64 if col.integer else np.float64)
                elif schema.added_later(col.name):
                    continue
                else:
                    data = np.full((rows,) + col.row, np.nan)
                f[f"metrics/{split}/{col.name}"] = data
    return path
