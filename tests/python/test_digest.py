#!/usr/bin/python3
"""Results digests (momfmm.digest; docs/design.md §8.8), the record of a finished run that
outlives the machine's runs/ directory:

    /usr/bin/python3 tests/python/test_digest.py        (or: pytest tests/python)

1. A run read from its HDF5 files, digested and read back, is the same run to the report: config,
   step, attributes, per-head γ and every eval table exact; train columns to 7 digits.
2. load_entries takes a run from its digest when the run directory is missing or has not reached
   the digest's step, and keeps the directory's run when it is as far on; the wall time comes with
   the digest.
3. A malformed digest (not JSON, another format or version, a bad step, ragged or non-numeric
   tables, bad INI, a bad γ; a FIFO, a directory, a file too large to be one) raises RunError
   naming the file; load_entries warns and goes on
   without that run, never crashing the report. A digest that cannot be written (here: its
   directory is a file) is a one-line error naming it, and no temporary file is left.
The end-to-end path (--save-digests, then a report from the digests alone equal to the report from
the runs) is in tests/e2e/test_experiments.py.
"""
import contextlib
import io
import json
import os
import tempfile
import unittest

import numpy as np
from checkpoints import write_checkpoint

from momfmm.digest import FORMAT, digest_of, read_digest, write_digest
from momfmm.files import RunError
from momfmm.rundir import load_run
from momfmm.results.cli import main as results_main
from momfmm.results.cli import save_digests
from momfmm.results.errors import ReportError
from momfmm.results.runs import load_entries
from momfmm.results.suite import Entry

CONFIG = "[model]\nn_layers = 2\nn_heads = 2\n\n[momentum]\ngamma = 0.2\n\n[train]\nsteps = {steps}\n"


def write_run(directory, step, steps=4, version="momfmm 0.2.0 (git test)"):
    """A run directory as momfmm writes it, reduced to what the reader needs: one checkpoint
    with its root attributes, config and /metrics tables (docs/files.md §4)."""
    os.makedirs(directory, exist_ok=True)
    n = step
    train = {"step": np.arange(1, n + 1), "loss": np.linspace(7.0, 1.0 / 3.0, n), "lr": np.full(n, 3e-4),
             "tokens_per_s": np.full(n, 12345.678901), "grad_norm": np.ones(n)}
    evals = {"step": [n], "loss": [0.123456789012345], "loss_by_k": np.arange(16, dtype=float).reshape(1, 16) / 7.0,
             "gain_R": [[1.5, 2.25]]}
    write_checkpoint(os.path.join(directory, f"ckpt_{step:08d}.h5"), CONFIG.format(steps=steps), step, train, evals,
                     attrs={"world_size": np.int32(2), "momfmm_version": version})
    with open(os.path.join(directory, "train.log"), "w") as f:
        f.write("# 2026-12-01T08:00:00 up 1 s\n# exit 0 after 42 s\n")


class RoundTrip(unittest.TestCase):
    def test_digest_reads_back_as_the_same_run(self):
        with tempfile.TemporaryDirectory() as tmp:
            write_run(os.path.join(tmp, "r"), step=4)
            run = load_run(os.path.join(tmp, "r"), label="r")
            path = os.path.join(tmp, "digests", "r.json")
            write_digest(path, run, wall_s=42, wall_unlogged=1)
            back, wall_s, unlogged = read_digest(path)
            self.assertEqual((back.name, back.step, back.ckpt_step, wall_s, unlogged), ("r", 4, 4, 42, 1))
            self.assertEqual(back.cfg("momentum.gamma"), "0.2")
            self.assertEqual(back.attrs["world_size"], 2)
            self.assertEqual(back.attrs["momfmm_version"], "momfmm 0.2.0 (git test)")
            np.testing.assert_array_equal(back.gamma, run.gamma)
            self.assertEqual(back.gamma_source, run.gamma_source)
            self.assertEqual(sorted(back.eval), sorted(run.eval))
            for key in run.eval:  # eval tables exact: the report's numbers do not move
                np.testing.assert_array_equal(back.eval[key], run.eval[key])
                self.assertEqual(back.eval[key].shape, run.eval[key].shape)
            self.assertNotIn("grad_norm", back.train)  # only the columns the report reads
            np.testing.assert_array_equal(back.train["step"], run.train["step"])
            np.testing.assert_allclose(back.train["loss"], run.train["loss"], rtol=1e-6)
            self.assertEqual(back.final_eval("loss"), run.final_eval("loss"))
            self.assertFalse(os.path.exists(path + f".tmp.{os.getpid()}"))

    def test_digest_is_deterministic(self):
        with tempfile.TemporaryDirectory() as tmp:
            write_run(os.path.join(tmp, "r"), step=4)
            run = load_run(os.path.join(tmp, "r"), label="r")
            self.assertEqual(json.dumps(digest_of(run, 42)), json.dumps(digest_of(run, 42)))


class Precedence(unittest.TestCase):
    def entries(self, tmp, local_step, digest_step):
        runs, digests = os.path.join(tmp, "runs"), os.path.join(tmp, "digests")
        os.makedirs(runs, exist_ok=True)
        write_run(os.path.join(tmp, "made_elsewhere"), step=digest_step, version="momfmm (elsewhere)")
        write_digest(os.path.join(digests, "r.json"), load_run(os.path.join(tmp, "made_elsewhere")), wall_s=99)
        if local_step:
            write_run(os.path.join(runs, "r"), step=local_step, version="momfmm (here)")
        e = Entry("r", "configs/x.ini", [], 1, "r configs/x.ini")
        load_entries([e], runs, digests)
        return e

    def test_missing_directory_reads_the_digest(self):
        with tempfile.TemporaryDirectory() as tmp:
            e = self.entries(tmp, local_step=0, digest_step=4)
            self.assertTrue(e.from_digest)
            self.assertEqual((e.run.step, e.wall_s, e.world_size), (4, 99, 2))
            self.assertEqual(e.run.attrs["momfmm_version"], "momfmm (elsewhere)")

    def test_partial_directory_gives_way_to_a_finished_digest(self):
        with tempfile.TemporaryDirectory() as tmp:
            e = self.entries(tmp, local_step=2, digest_step=4)
            self.assertTrue(e.from_digest)
            self.assertEqual(e.run.step, 4)

    def test_directory_as_far_on_wins(self):
        with tempfile.TemporaryDirectory() as tmp:
            e = self.entries(tmp, local_step=4, digest_step=4)
            self.assertFalse(e.from_digest)
            self.assertEqual((e.run.attrs["momfmm_version"], e.wall_s), ("momfmm (here)", 42))

    def test_odd_world_size_is_unknown_not_a_crash(self):
        with tempfile.TemporaryDirectory() as tmp:
            write_run(os.path.join(tmp, "r"), step=4)
            path = os.path.join(tmp, "digests", "r.json")
            write_digest(path, load_run(os.path.join(tmp, "r")))
            for odd in ("two", [2, 2], None, 1e400):
                with open(path) as f:
                    d = json.load(f)
                d["attrs"]["world_size"] = odd
                with open(path, "w") as f:
                    json.dump(d, f)
                e = Entry("r", "configs/x.ini", [], 1, "r configs/x.ini")
                load_entries([e], os.path.join(tmp, "no_runs"), os.path.dirname(path))
                self.assertTrue(e.from_digest)
                self.assertIsNone(e.world_size)

    def test_no_digests_directory(self):
        with tempfile.TemporaryDirectory() as tmp:
            e = Entry("r", "configs/x.ini", [], 1, "r configs/x.ini")
            load_entries([e], tmp, None)
            self.assertIsNone(e.run)


class Malformed(unittest.TestCase):
    def good(self, tmp):
        write_run(os.path.join(tmp, "r"), step=4)
        return digest_of(load_run(os.path.join(tmp, "r")), 42)

    def expect_error(self, tmp, text, fragment):
        path = os.path.join(tmp, "bad.json")
        with open(path, "wb") as f:
            f.write(text if isinstance(text, bytes) else text.encode())
        with self.assertRaises(RunError) as cm:
            read_digest(path)
        message = str(cm.exception)
        self.assertIn(path, message)
        self.assertIn(fragment, message)
        self.assertNotIn("\n", message)
        e = Entry("bad", "configs/x.ini", [], 1, "bad configs/x.ini")
        load_entries([e], os.path.join(tmp, "no_runs"), tmp)  # warns, goes on
        self.assertIsNone(e.run)

    def test_each_defect_is_named(self):
        with tempfile.TemporaryDirectory() as tmp:
            good = self.good(tmp)

            def variant(**changes):
                d = json.loads(json.dumps(good))
                for key, value in changes.items():
                    section, _, name = key.partition("__")
                    if name:
                        d[section][name] = value
                    elif value is None:
                        del d[section]
                    else:
                        d[section] = value
                return json.dumps(d)
            cases = [
                ("{not json", "not a readable digest"),
                ("", "not a readable digest"),
                ("[" * 100000 + "]" * 100000, "not a readable digest"),
                ("[1, 2]", f"not a {FORMAT} file"),
                (variant(format="momfmm-checkpoint"), f"not a {FORMAT} file"),
                (variant(version=2), "digest version 2"),
                (variant(step=-1), "step is -1"),
                (variant(step="4"), 'step is "4"'),
                (variant(step=1.5), "step is 1.5"),
                (variant(ckpt_step=True), "ckpt_step is true"),
                (variant(config_ini=None), "config_ini is not text"),
                (variant(config_ini="no section"), "config_ini is not valid INI"),
                (variant(eval__loss="x"), "eval.loss is not a list"),
                (variant(eval__loss_by_k=[[1.0, 2.0], [3.0]]), "eval.loss_by_k is not a table of numbers"),
                (variant(eval__loss=["a"]), "eval.loss is not a table of numbers"),
                (variant(eval__loss=[1.0, 2.0]), "eval columns differ in length"),
                (variant(train=[1]), "train is not an object"),
                (variant(gamma=[[1.0], [2.0, 3.0]]), "gamma is not a layers x heads table"),
                (variant(gamma=[1.0, 2.0]), "gamma is not a layers x heads table"),
                (variant(attrs=[1]), "attrs or gamma_source malformed"),
                (variant(wall_s=float("nan")), "wall_s is NaN"),
                (variant(eval__step=[1.5]), "eval.step is not a table of whole numbers"),
                (b"\xff\xfe{", "not a readable digest"),
            ]
            for text, fragment in cases:
                with self.subTest(fragment=fragment, text=text[:40]):
                    self.expect_error(tmp, text, fragment)

    def test_fifo_directory_and_huge_file_are_refused_without_reading(self):
        with tempfile.TemporaryDirectory() as tmp:
            fifo, directory, huge = (os.path.join(tmp, n + ".json") for n in ("fifo", "dir", "huge"))
            os.mkfifo(fifo)  # opening it to read would block: it must not be opened
            os.mkdir(directory)
            with open(huge, "wb") as f:
                f.truncate((64 << 20) + 1)
            for path, fragment in ((fifo, "cannot open digest: not a regular file but a FIFO"),
                                   (directory, "cannot open digest: not a regular file but a directory"),
                                   (huge, "67108865 bytes, more than the 67108864 a digest may hold")):
                with self.subTest(path=path), self.assertRaises(RunError) as cm:
                    read_digest(path)
                self.assertIn(f"{path}: {fragment}", str(cm.exception))

    def test_digests_option_that_is_not_a_directory_exits_2(self):
        with tempfile.TemporaryDirectory() as tmp:
            fifo, plain = os.path.join(tmp, "fifo"), os.path.join(tmp, "plain")
            os.mkfifo(fifo)
            open(plain, "w").close()
            for value in ("", fifo, plain):
                err = io.StringIO()
                with self.subTest(value=value), contextlib.redirect_stderr(err), \
                        self.assertRaises(SystemExit) as cm:
                    results_main(["--runs", tmp, "--digests", value, "--no-figures"])
                self.assertEqual(cm.exception.code, 2)
                self.assertIn(f"--digests '{value}': not a directory", err.getvalue())

    def test_unwritable_digest_is_an_error(self):
        with tempfile.TemporaryDirectory() as tmp:
            runs = os.path.join(tmp, "runs")
            write_run(os.path.join(runs, "r"), step=4)
            e = Entry("r", "configs/x.ini", [], 1, "r configs/x.ini")
            load_entries([e], runs, None)
            blocker = os.path.join(tmp, "digests")
            open(blocker, "w").close()
            with self.assertRaises(ReportError) as cm:
                save_digests([e], blocker)
            self.assertEqual(cm.exception.status, 1)
            self.assertIn(f"cannot write {blocker}/r.json", str(cm.exception))
            self.assertNotIn("\n", str(cm.exception))
            with contextlib.redirect_stderr(io.StringIO()):
                save_digests([e], os.path.join(tmp, "ok"))
            self.assertEqual(os.listdir(os.path.join(tmp, "ok")), ["r.json"])


if __name__ == "__main__":
    unittest.main()
