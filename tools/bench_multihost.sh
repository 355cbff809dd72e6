#!/usr/bin/env bash
# The alpha-beta model against the network it models (docs/cluster.md
# §10.8, docs/design.md §8.11): on a test bed of 4 hosts
# (tests/multihost/netbed.sh, 1 rank per host), with the hosts' links
# unshaped, shaped to 10 Gb/s and to 1 Gb/s (tc tbf on eth0 inside every
# host), at 2 and 4 hosts:
#   - build/net_probe fits alpha and beta (ping-pong, least squares);
#   - tools/scaling_model.py predicts the gradient all-reduce of the bench
#     model from them (dist.bucket_mb 4);
#   - `momfmm bench` measures it: allreduce_wait_ms with dist.overlap = false
#     is the whole all-reduce (one sample per rank, so the ranks' compute,
#     and the wait for the slower one, stays small);
# then, at 1 Gb/s on 2 hosts, dist.bucket_mb 1, 4, 16, 64 with overlap on;
# then context parallelism (docs/design.md §8.12) on 2 hosts at each shape:
# `momfmm bench configs/bench_fmm.ini` with dist.context = 2 at T =
# CONTEXT_T, FMM and causal softmax (ring attention), its context_wait_ms
# against scaling_model.py's context term from the fitted alpha and beta.
# Every figure is repeated REPEATS times; the summary gives medians.
#
#   sudo tools/bench_multihost.sh [OUT_DIR]     (root: network namespaces)
#
# Variables: BUILD (build dir, default build), PREFIX (the bed's namespaces,
# default nbm: never one another bed uses), REPEATS (3), STEPS (5), CONFIG
# (configs/bench_d256.ini) and PARAMS (its parameter count, 3683840),
# BUCKETS ("1 4 16 64"), SHAPES ("10gbit 1gbit"; "none": unshaped), MPI_ARGS
# (more mpirun options; default "--mca mpi_yield_when_idle 1"), PARTS (what
# to run: "allreduce buckets context"), CONTEXT_T (16384), CONTEXT_KINDS
# ("fmm softmax").
# Writes OUT_DIR/raw.tsv (one row per run) and prints the summary
# (OUT_DIR/summary.md). Exits 77 where the bed cannot be made.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${BUILD:-$ROOT/build}
PREFIX=${PREFIX:-nbm}
REPEATS=${REPEATS:-3}
STEPS=${STEPS:-5}
CONFIG=${CONFIG:-$ROOT/configs/bench_d256.ini}
PARAMS=${PARAMS:-3683840} # parameters of CONFIG (bench_d256), for the model
BUCKETS=${BUCKETS:-1 4 16 64}
PARTS=${PARTS:-allreduce buckets context}
CONTEXT_T=${CONTEXT_T:-16384}
CONTEXT_KINDS=${CONTEXT_KINDS:-fmm softmax}
SHAPES=${SHAPES:-10gbit 1gbit}
# a rank that waits yields its core (Open MPI polls otherwise): on a shared
# machine the busy poll of one rank holds the core another rank needs, and
# small-message times become the scheduler's time slice (measured: 6 ms)
MPI_ARGS=${MPI_ARGS:---mca mpi_yield_when_idle 1}
PY=/usr/bin/python3
NETBED=$ROOT/tests/multihost/netbed.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

refuse() { echo "bench_multihost: $*" >&2; exit 2; }

# Every argument and variable checked before the bed is made (docs/cli.md §5: one line, exit 2).
check_settings() {
    local name value
    [ $# -le 1 ] || refuse "one argument at most, OUT_DIR (got $#)"
    case ${1:-} in -*) refuse "$1: not an option; the one argument is OUT_DIR (usage: the header of $0)" ;; esac
    for name in REPEATS STEPS PARAMS CONTEXT_T; do
        [[ ${!name} =~ ^[1-9][0-9]{0,9}$ ]] || refuse "$name='${!name}': expected a positive integer"
    done
    for value in $BUCKETS; do
        [[ $value =~ ^[0-9]+(\.[0-9]+)?$ ]] && [[ ! $value =~ ^0+(\.0*)?$ ]] ||
            refuse "BUCKETS: '$value': expected MB above 0"
    done
    for value in $SHAPES; do
        [[ $value =~ ^([1-9][0-9]*(\.[0-9]+)?[kmg]?bit|none)$ ]] || refuse "SHAPES: '$value': expected a tc rate (10gbit) or none"
    done
    for value in $PARTS; do
        [[ $value =~ ^(allreduce|buckets|context)$ ]] || refuse "PARTS: '$value': expected allreduce, buckets or context"
    done
    for value in $CONTEXT_KINDS; do
        [[ $value =~ ^(fmm|softmax)$ ]] || refuse "CONTEXT_KINDS: '$value': expected fmm or softmax"
    done
    [ -n "${SHAPES// /}" ] && [ -n "${PARTS// /}" ] || refuse "SHAPES and PARTS name at least one each"
    [ -e "$CONFIG" ] || refuse "CONFIG=$CONFIG: no such config file"
    [ -f "$CONFIG" ] || refuse "CONFIG=$CONFIG: not a regular file (a config is INI text)"
    for value in "$BUILD/momfmm" "$BUILD/net_probe"; do
        [ -f "$value" ] && [ -x "$value" ] || refuse "$value not built (BUILD=$BUILD)"
    done
}

if [ "${1:-}" != --inside ]; then
    check_settings "$@"
    OUT=$(realpath -m -- "${1:-$ROOT/results/bench_multihost}")
    [ ! -e "$OUT" ] || [ -d "$OUT" ] || refuse "$OUT: exists and is not a directory (OUT_DIR)"
    mkdir -p -- "$OUT" || exit 3
    exec "$NETBED" with "$PREFIX" 4 "$OUT/bed" -- "${BASH_SOURCE[0]}" --inside "$OUT"
fi
OUT=$2
RAW=$OUT/raw.tsv

# mpirun on host 1 across hosts 1..n, one rank each, over the bed's subnet
across() {
    local n=$1 i
    shift
    : >"$OUT/hosts_$n"
    for i in $(seq 1 "$n"); do echo "10.77.0.$i slots=1" >>"$OUT/hosts_$n"; done
    "$NETBED_SCRIPT" on "$NETBED_PREFIX" 1 -- mpirun --oversubscribe --hostfile "$OUT/hosts_$n" -np "$n" \
        --map-by slot --mca plm_rsh_agent "$NETBED_AGENT" --mca btl tcp,self \
        --mca btl_tcp_if_include "$NETBED_SUBNET" --mca oob_tcp_if_include "$NETBED_SUBNET" \
        -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS $MPI_ARGS "$@"
}

# tc tbf on eth0 of every host: RATE (none: no qdisc); burst about 1 ms of the rate
shape() {
    local rate=$1 i burst
    case $rate in 10gbit) burst=1280kb ;; *) burst=128kb ;; esac
    for i in $(seq 1 "$NETBED_HOSTS"); do
        ip netns exec "$NETBED_PREFIX-h$i" tc qdisc del dev eth0 root 2>/dev/null
        [ "$rate" = none ] && continue
        ip netns exec "$NETBED_PREFIX-h$i" tc qdisc add dev eth0 root tbf rate "$rate" burst "$burst" latency 50ms ||
            { echo "bench_multihost: tc tbf on $NETBED_PREFIX-h$i failed" >&2; exit 1; }
    done
}

load() { cut -d' ' -f1 /proc/loadavg; }

part() { [[ " $PARTS " == *" $1 "* ]]; }

row() { printf '%s\n' "$*" | tr ' ' '\t' >>"$RAW"; }

probe() {
    local shape=$1 n=$2 rep=$3
    local log=$OUT/probe_${shape}_${n}_$rep.log
    across "$n" "$BUILD/net_probe" --seconds 0.3 >"$log" 2>&1
    local fit
    fit=$(grep '^fit ' "$log" | sed -E 's/.*alpha_us=([0-9.]+) beta_gbps=([0-9.]+).*/\1 \2/')
    [ -n "$fit" ] || { echo "bench_multihost: net_probe failed, see $log" >&2; return; }
    # the probe's own all-reduce of 8 MiB, measured and by the ring model
    local ar
    ar=$(grep "^allreduce ranks=$n bytes=8388608 " "$log" | sed -E 's/.* ms=([0-9.]+) ring_model_ms=([0-9.]+)/\1 \2/')
    row probe "$shape" "$n" "$rep" $fit ${ar:-nan nan} "$(load)"
}

bench() {
    local shape=$1 n=$2 rep=$3 bucket=$4 overlap=$5
    local log=$OUT/bench_${shape}_${n}_${bucket}_${overlap}_$rep.log
    across "$n" "$BUILD/momfmm" bench "$CONFIG" --steps "$STEPS" --set train.batch_size="$n" \
        --set dist.bucket_mb="$bucket" --set dist.overlap="$overlap" --set train.gemm=openblas \
        --set train.out_dir="$OUT/run" >"$log" 2>&1
    local m
    m=$(grep -o 'ms_per_step=[0-9.]* gflops=[0-9.]* allreduce_wait_ms=[0-9.]*' "$log" |
        sed -E 's/ms_per_step=([0-9.]+) gflops=[0-9.]+ allreduce_wait_ms=([0-9.]+)/\1 \2/')
    [ -n "$m" ] || { echo "bench_multihost: bench failed, see $log" >&2; return; }
    row bench "$shape" "$n" "$rep" "$bucket" "$overlap" $m "$(load)"
}

# context parallelism across 2 hosts: one sequence of CONTEXT_T, dist.context = 2
bench_context() {
    local shape=$1 kind=$2 rep=$3
    local log=$OUT/context_${shape}_${kind}_$rep.log
    across 2 "$BUILD/momfmm" bench "$ROOT/configs/bench_fmm.ini" --steps "$STEPS" --set dist.context=2 \
        --set data.seq_len="$CONTEXT_T" --set model.max_seq_len="$CONTEXT_T" --set attention.kind="$kind" \
        --set train.gemm=openblas --set train.out_dir="$OUT/run" >"$log" 2>&1
    local step wait sent att
    step=$(grep -o '\bms_per_step=[0-9.]*' "$log" | cut -d= -f2)
    wait=$(grep -o 'context_wait_ms=[0-9.]*' "$log" | cut -d= -f2)
    sent=$(grep -o 'context_sent_mb_per_step=[0-9.]*' "$log" | cut -d= -f2)
    att=$(grep -o 'attention_ms_mean=[0-9.]*' "$log" | cut -d= -f2)
    [ -n "$step" ] && [ -n "$wait" ] || { echo "bench_multihost: context bench failed, see $log" >&2; return; }
    row context "$shape" "$kind" "$rep" "$step" "$wait" "$sent" "$att" "$(load)"
}

: >"$RAW"
echo "bed $NETBED_PREFIX, mpirun $MPI_ARGS: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(grep -c ^processor /proc/cpuinfo) cores, load $(load)"
for shape in $SHAPES; do
    shape "$shape"
    for n in 2 4; do
        for rep in $(seq 1 "$REPEATS"); do
            if part allreduce || { part context && [ "$n" = 2 ]; }; then probe "$shape" "$n" "$rep"; fi
            part allreduce && bench "$shape" "$n" "$rep" 4 false
        done
    done
    for rep in $(seq 1 "$REPEATS"); do
        for kind in $CONTEXT_KINDS; do part context && bench_context "$shape" "$kind" "$rep"; done
    done
done
if part buckets; then
    shape 1gbit
    for rep in $(seq 1 "$REPEATS"); do
        for bucket in $BUCKETS; do bench 1gbit 2 "$rep" "$bucket" true; done
    done
fi
shape none
"$PY" - "$RAW" "$PARAMS" "$ROOT/tools" "$CONTEXT_T" <<'PYEOF' | tee "$OUT/summary.md"
import statistics as st, sys
sys.path.insert(0, sys.argv[3])
import scaling_model as sm
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
n_params = float(sys.argv[2])
med = lambda xs: st.median(xs) if xs else float("nan")
loads = [float(r[-1]) for r in rows]
print(f"n = {n_params:,.0f} parameters, buckets of 4 MB (k = {sm.n_buckets(n_params, 4)}); medians of "
      f"{max(int(r[3]) for r in rows)} runs; load average during the runs {min(loads):.1f}-{max(loads):.1f}\n")
print("| link | hosts | α fitted (µs) | β fitted (Gb/s) | 8 MiB all-reduce: ring model / net_probe (ms) "
      "| bench all-reduce predicted (ms) | bench allreduce_wait_ms measured | bench step (ms) |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for shape in dict.fromkeys(r[1] for r in rows):
    for n in ("2", "4"):
        pr = [r for r in rows if r[0] == "probe" and r[1] == shape and r[2] == n]
        be = [r for r in rows if r[0] == "bench" and r[1] == shape and r[2] == n and r[5] == "false"]
        if not pr or not be:
            continue
        a, b = med([float(r[4]) for r in pr]), med([float(r[5]) for r in pr])
        pred = sm.allreduce_seconds(int(n), n_params, a * 1e-6, b * 1e9 / 8, sm.n_buckets(n_params, 4)) * 1e3
        p8, m8 = med([float(r[7]) for r in pr]), med([float(r[6]) for r in pr])
        print(f"| {shape} | {n} | {a:.1f} | {b:.2f} | {p8:.0f} / {m8:.0f} | {pred:.0f} "
              f"| {med([float(r[7]) for r in be]):.0f} | {med([float(r[6]) for r in be]):.0f} |")
cx = [r for r in rows if r[0] == "context"]
if cx:
    import argparse
    print("\n| link | dist.context = 2, bench_fmm T | attention | α, β fitted (2 hosts) | sent a step (MB) "
          "| context wait measured (ms) | context term predicted (ms): all / exposed | step (ms) |")
    print("|---|---:|---|---|---:|---:|---:|---:|")
    for shape in dict.fromkeys(r[1] for r in cx):
        pr = [r for r in rows if r[0] == "probe" and r[1] == shape and r[2] == "2"]
        a_us, b_gbps = med([float(r[4]) for r in pr]), med([float(r[5]) for r in pr])
        for kind in dict.fromkeys(r[2] for r in cx if r[1] == shape):
            sel = [r for r in cx if r[1] == shape and r[2] == kind]
            att = med([float(r[7]) for r in sel])
            T = int(sys.argv[4])
            shape_args = argparse.Namespace(kind=kind, layers=4, d_model=256, heads=8, kernels=2, band=5,
                                            rows_per_rank=1, tokens_per_rank=T / 2, attention_ms=att)
            t, exposed = sm.context_seconds(2, shape_args, a_us * 1e-6, b_gbps * 1e9 / 8)
            print(f"| {shape} | {T:,} | {kind} | {a_us:.1f} µs, {b_gbps:.2f} Gb/s | {med([float(r[6]) for r in sel]):.2f} "
                  f"| {med([float(r[5]) for r in sel]):.0f} | {t * 1e3:.0f} / {exposed * 1e3:.0f} "
                  f"| {med([float(r[4]) for r in sel]):.0f} |")
bk = [r for r in rows if r[0] == "bench" and r[5] == "true"]
if bk:
    print("\n| dist.bucket_mb (1 Gb/s, 2 hosts, overlap on) | step (ms) | allreduce_wait_ms |")
    print("|---:|---:|---:|")
    for b in dict.fromkeys(r[4] for r in bk):
        sel = [r for r in bk if r[4] == b]
        print(f"| {b} | {med([float(r[6]) for r in sel]):.0f} | {med([float(r[7]) for r in sel]):.0f} |")
PYEOF
