"""The GEMM engines in training (docs/design.md §8.10), one class per CTest entry
(e2e_gemm_<group>, tests/CMakeLists.txt):

- TestGemmAuto: train.gemm = auto on 2 ranks takes one choice everywhere (the parameter
  checksum would stop ranks that computed differently), records it in the checkpoint and a
  resumed run takes it from there; momfmm's own AVX-512 kernel (train.gemm = avx512) trains
  where the CPU has AVX-512F, is refused with exit 2 where it has not
  (MOMFMM_FAKE_NO_AVX512=1 plays such a CPU), and a checkpoint recording it resumes and
  evaluates there on OpenBLAS.

The runs use test_mpi.py's Runner (its R fixture): the same tiny configs and launcher.
"""
import os
import re

import h5py
import pytest

from common import env, run, train_command, unavailable
from test_mpi import R  # noqa: F401  (the module's Runner fixture)


TIMED = "gemm auto: the engines timed on "
SHARED = ", shared by the ranks"
CHOICE = re.compile(r"gemm auto: (forward=\S+,backward_data=\S+,backward_weight=[a-z0-9-]+)")


def shared_expected(np_, environ):
    """Whether np_ ranks share the timing out (docs/design.md §8.10): only where each has
    CPUs of its own, np_ x OMP_NUM_THREADS at most the CPUs this process may use (what
    mpirun's ranks may use together)."""
    threads = int((environ.get("OMP_NUM_THREADS") or "1").split(",")[0])
    return np_ * threads <= len(os.sched_getaffinity(0))


class TestGemmAuto:
    """train.gemm = auto (the default; docs/design.md §8.10): the ranks time the engines,
    sharing the shapes out where each has CPUs of its own and rank 0 alone where they
    outnumber them, and every rank takes rank 0's choice. Products large enough to be tuned (512 rows of
    d 128, d_ff 512); the parameter checksum every step (dist.check_interval = 1)
    would stop the run if two ranks computed with different engines. The choice goes
    into the checkpoint and a resumed run takes it from there."""

    SIZE = {"model.d_model": 128, "model.n_heads": 4, "model.d_ff": 512, "data.seq_len": 64,
            "train.batch_size": 16, "train.steps": 6, "train.eval_interval": 6}

    def test_same_choice_on_every_rank(self, R, report):
        r, ckpt = R.train("gemm_auto", 2, **self.SIZE)
        choice = CHOICE.search(r.stdout)
        report.check("np=2 auto: trains to the end with every step's checksum equal on both ranks",
                     r.returncode == 0 and ckpt is not None, f"rc {r.returncode}: {r.stderr[-400:]}")
        report.check("np=2 auto: the start-up line names each class's engine, timed", choice is not None and
                     TIMED in r.stdout,
                     " / ".join(l for l in r.stdout.splitlines() if "gemm" in l)[:300])
        report.check("np=2 auto: the timing shared by the ranks where each has a CPU of its own, not elsewhere",
                     (SHARED in r.stdout) == shared_expected(2, env()),
                     f"{len(os.sched_getaffinity(0))} CPUs: " +
                     " / ".join(l for l in r.stdout.splitlines() if TIMED in l))
        if not ckpt:
            return
        with h5py.File(ckpt, "r") as f:
            recorded = f.attrs.get("gemm_engines")
        recorded = recorded.decode() if isinstance(recorded, bytes) else recorded
        report.check("the checkpoint records the choice (root attribute gemm_engines)",
                     choice is not None and recorded == choice.group(1), f"{recorded!r} vs start-up line")
        path, _ = R.config("gemm_auto", **dict(self.SIZE, **{"train.steps": 8}))
        resumed = run(train_command(R.momfmm, path, (), np_=2, resume=ckpt), timeout=300, env=env())
        report.check("a resumed run takes the recorded choice, without timing the engines", resumed.returncode == 0 and
                     f"gemm auto: {recorded}, as {ckpt} recorded" in resumed.stdout and TIMED not in resumed.stdout,
                     f"rc {resumed.returncode}: " + " / ".join(l for l in resumed.stdout.splitlines() if "gemm" in l))
        # a checkpoint that recorded none (an older file): the resumed run times the engines
        # itself, at 4 ranks (on 2 CPUs, more ranks than CPUs: rank 0 times alone)
        with h5py.File(ckpt, "r+") as f:
            del f.attrs["gemm_engines"]
        resumed = run(train_command(R.momfmm, path, ("train.steps=10",), np_=4, resume=ckpt), timeout=300, env=env())
        timed = CHOICE.search(resumed.stdout)
        report.check("a checkpoint without a recorded choice resumes at np=4, the engines timed at start-up, "
                     "shared only where each rank has a CPU of its own",
                     resumed.returncode == 0 and timed is not None and "recorded" not in resumed.stdout and
                     TIMED in resumed.stdout and (SHARED in resumed.stdout) == shared_expected(4, env()),
                     f"rc {resumed.returncode}: " + " / ".join(l for l in resumed.stdout.splitlines() if "gemm" in l))

    def test_uneven_shards_time_one_list(self, R, report):
        """A batch of 5 on 2 ranks: the shards differ by a sequence, so the ranks' products
        do too, and some lie on either side of GEMM_AUTO_MIN_MACS (d 128, d_ff 384, T 128).
        The ranks time parts of rank 0's list (docs/design.md §8.10): as many shapes as one
        process of rank 0's rows times."""
        size = {"model.d_model": 128, "model.n_heads": 4, "model.d_ff": 384, "model.vocab_size": 512,
                "data.seq_len": 128, "train.steps": 2, "train.eval_interval": 0}
        r, _ = R.train("gemm_uneven", 2, **dict(size, **{"train.batch_size": 5}))
        rows = re.search(r"activations [\d.]+ MB for (\d+) x", r.stdout)
        timed = re.search(TIMED + r"(\d+) of", r.stdout)
        if not report.check("np=2, batch 5: trains, rank 0's shard and the timing said", r.returncode == 0 and
                            rows is not None and timed is not None, f"rc {r.returncode}: {r.stdout[-300:]}"):
            return
        alone, _ = R.train("gemm_uneven_alone", 1, direct=True, **dict(size, **{"train.batch_size": rows.group(1)}))
        single = re.search(TIMED + r"(\d+) of", alone.stdout)
        report.check("the two ranks time as many shapes as one process of rank 0's rows",
                     single is not None and single.group(1) == timed.group(1),
                     f"np=2: {timed.group(0)}; one process of {rows.group(1)} sequences: "
                     f"{single.group(0) if single else alone.stdout[-200:]}")

    def test_own_kernel_and_machines_without_it(self, R, report):
        """momfmm's own AVX-512 kernel (train.gemm = avx512; docs/design.md §8.10): it trains
        where the CPU has AVX-512F; a CPU without it (MOMFMM_FAKE_NO_AVX512=1 plays one)
        refuses it with exit 2, and a checkpoint whose recorded choice names it resumes
        there on OpenBLAS, saying so."""
        no_avx512 = {"MOMFMM_FAKE_NO_AVX512": "1"}
        r, _ = R.train("gemm_own_refused", 1, sets=["train.gemm=avx512"], direct=True, extra_env=no_avx512,
                       **dict(self.SIZE, **{"train.steps": 2}))
        report.check("train.gemm = avx512 without AVX-512F: exit 2 naming the key and the reason",
                     r.returncode == 2 and "train.gemm = avx512" in r.stderr and "AVX-512F" in r.stderr
                     and len(r.stderr.strip().splitlines()) == 1, f"rc {r.returncode}: {r.stderr.strip()[-300:]}")
        if unavailable(R.momfmm, "avx512"):
            pytest.skip("this CPU has no AVX-512F: the kernel itself cannot run here")
        r, ckpt = R.train("gemm_own", 1, sets=["train.gemm=avx512"], direct=True, **self.SIZE)
        report.check("train.gemm = avx512 trains and names the kernel at start-up",
                     r.returncode == 0 and ckpt is not None and "avx512-f32" in r.stdout,
                     f"rc {r.returncode}: {r.stderr[-300:]}")
        r, ckpt = R.train("gemm_auto_own", 1, direct=True, **self.SIZE)
        if not report.check("auto trains (the choice recorded)", r.returncode == 0 and ckpt is not None,
                            f"rc {r.returncode}: {r.stderr[-300:]}"):
            return
        own = "forward=avx512-f32,backward_data=avx512-f32,backward_weight=avx512-f32"
        with h5py.File(ckpt, "r+") as f:
            f.attrs["gemm_engines"] = own
        path, _ = R.config("gemm_auto_own", **dict(self.SIZE, **{"train.steps": 8}))
        resumed = run(train_command(R.momfmm, path, (), resume=ckpt), timeout=300, env=env(**no_avx512))
        fallback = "forward=openblas,backward_data=openblas,backward_weight=openblas"
        report.check("a recorded avx512-f32 resumes on OpenBLAS where the CPU lacks AVX-512F",
                     resumed.returncode == 0 and f"gemm auto: {fallback}, as {ckpt} recorded" in resumed.stdout,
                     f"rc {resumed.returncode}: " + " / ".join(l for l in resumed.stdout.splitlines() if "gemm" in l))
        ev = run([R.momfmm, "eval", ckpt], timeout=120, env=env(**no_avx512))
        report.check("eval of that checkpoint runs there too", ev.returncode == 0, ev.stderr[-300:])
        # the whole AVX2 core played (src/base/cpu.h): bench's peak is the AVX2 one, auto
        # times the AVX2 engines only, and bf16 is refused as on such a core
        path, _ = R.config("gemm_played", **self.SIZE)
        b = run([R.momfmm, "bench", path, "--steps", "1"], timeout=300, env=env(**no_avx512))
        report.check("bench on an AVX2 core played: the AVX2 FMA peak, no AVX-512 engine in auto's choice",
                     b.returncode == 0 and "(avx2+fma, " in b.stdout and "avx512-f32" not in b.stdout,
                     " / ".join(l for l in b.stdout.splitlines() if "peak" in l or "gemm" in l) + b.stderr[-200:])
        b = run([R.momfmm, "bench", path, "--steps", "1", "--set", "train.precision=bf16"], timeout=300,
                env=env(**no_avx512))
        report.check("bf16 on an AVX2 core played: exit 2 naming AVX512_BF16, one line",
                     b.returncode == 2 and "AVX512_BF16" in b.stderr and len(b.stderr.strip().splitlines()) == 1,
                     b.stderr[-300:])
