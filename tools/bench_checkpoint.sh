#!/usr/bin/env bash
# Checkpoint write speed against the disk: trains a ~25M-parameter model
# (d 512, 6 layers, d_ff 2048, vocab 6144: with the AdamW moments about
# 300 MB of float32) for one step, reads the time of its checkpoint from the
# log line `checkpoint <path> | <MB> MB in <s> s (<MB/s> MB/s)` (temporary
# file, fsync, rename, directory fsync), and times
# `dd if=/dev/zero bs=1M conv=fsync` of the same size into the same
# directory. Prints both and their ratio for each round (alternating which
# goes first; the disk may be shared) and the median ratio. Target:
# checkpoint time <= 2 x dd time.
#
# With --ranks N it compares instead, on the same model under mpirun -np N,
# the checkpoint written by rank 0 alone (dist.zero = 0) with the one all
# ranks write together through parallel HDF5 (dist.zero = 1, docs/scale.md
# §7), with independent and with collective data transfers
# (dist.collective_io), rotating which goes first, and prints every time
# and the medians.
#
# Usage: tools/bench_checkpoint.sh [--ranks N] [OUT_DIR]  (default runs/bench_checkpoint)
# Environment: MOMFMM (binary, default build/momfmm), ROUNDS (default 3).
# Everything written goes into a temporary directory under OUT_DIR, removed
# at the end (and OUT_DIR too if this script created it and it is empty).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${MOMFMM:-$root/build/momfmm}
ranks=0
if [ "${1:-}" = --ranks ]; then
    [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || { echo "bench_checkpoint: --ranks needs a positive integer" >&2; exit 2; }
    ranks=$2
    shift 2
fi
out=${1:-$root/runs/bench_checkpoint}
rounds=${ROUNDS:-3}
refuse() { echo "bench_checkpoint: $*" >&2; exit 2; }
[ $# -le 1 ] || refuse "one OUT_DIR at most (got $#: $*)"
case $out in -*) refuse "$out: not an option; usage: tools/bench_checkpoint.sh [--ranks N] [OUT_DIR]" ;; esac
[ ! -e "$out" ] || [ -d "$out" ] || refuse "$out: exists and is not a directory (OUT_DIR)"
[[ $rounds =~ ^[1-9][0-9]{0,3}$ ]] || refuse "ROUNDS='$rounds': expected a positive integer"
[ -f "$bin" ] && [ -x "$bin" ] || refuse "$bin is not an executable (build first, or set MOMFMM)"
created=
[ -d "$out" ] || created=1
mkdir -p "$out"
work=$(mktemp -d "$out/bench_checkpoint.XXXXXX")
trap 'rm -rf "$work"; [ -z "$created" ] || rmdir "$out" 2>/dev/null || true' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 LC_ALL=C

cat > "$work/bench.ini" <<EOF
[model]
vocab_size = 6144
d_model = 512
n_heads = 8
n_layers = 6
d_ff = 2048

[data]
task = chain
seq_len = 16
chain_len = 5

[train]
steps = 1
batch_size = $(( ranks > 1 ? ranks : 1 ))
eval_interval = 0
log_interval = 1
out_dir = $work/run
EOF

now() { date +%s.%N; }
median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

# --ranks N: the step-1 checkpoint's log line at dist.zero = $1, dist.collective_io = $2
ranks_checkpoint() {
    rm -rf "$work/run"
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np "$ranks" \
        "$bin" train "$work/bench.ini" --set dist.zero="$1" --set dist.collective_io="$2" > "$work/train.log" 2>&1 ||
        { cat "$work/train.log" >&2; exit 1; }
    grep '^checkpoint ' "$work/train.log" | tail -1 > "$work/line"
    params=$(sed -n 's/^model: \([0-9]*\) parameters.*/\1/p' "$work/train.log")
    rm -rf "$work/run"
}
if [ "$ranks" -gt 0 ]; then
    variants=("0 false" "1 false" "1 true")
    labels=("zero 0 (rank 0 alone)" "zero 1 (all ranks, independent)" "zero 1 (all ranks, collective)")
    declare -A seconds
    for ((r = 1; r <= rounds; r++)); do
        for ((i = 0; i < 3; i++)); do
            v=$(((r + i) % 3))
            # shellcheck disable=SC2086
            ranks_checkpoint ${variants[v]}
            seconds[$v]+="$(awk '{print $7}' "$work/line") "
            printf 'round %d: np %d %s | %s parameters | %s\n' "$r" "$ranks" "${labels[v]}" "$params" \
                "$(cut -d'|' -f2- "$work/line" | sed 's/^ //')"
        done
    done
    for v in 0 1 2; do
        printf 'median checkpoint time at np %d over %d rounds: %s %s s\n' "$ranks" "$rounds" "${labels[v]}" \
            "$(tr ' ' '\n' <<<"${seconds[$v]}" | sed '/^$/d' | median)"
    done
    exit 0
fi
ratios=()
printf 'out_dir %s (%s)\n' "$out" "$(df -h --output=source,fstype "$out" | tail -1 | tr -s ' ')"
for ((r = 1; r <= rounds; r++)); do
    for order in $( ((r % 2)) && echo "ckpt dd" || echo "dd ckpt"); do
        if [ "$order" = ckpt ]; then
            rm -rf "$work/run"
            "$bin" train "$work/bench.ini" > "$work/train.log" 2>&1 || { cat "$work/train.log" >&2; exit 1; }
            params=$(sed -n 's/^model: \([0-9]*\) parameters.*/\1/p' "$work/train.log")
            line=$(grep '^checkpoint ' "$work/train.log" | tail -1)
            ck_path=$(awk '{print $2}' <<< "$line")
            ck_mb=$(awk '{print $4}' <<< "$line")
            ck_s=$(awk '{print $7}' <<< "$line")
            bytes=$(stat -c %s "$ck_path")
            rm -rf "$work/run"
        else
            # same size as the checkpoint (the first round's, if dd goes first)
            count=$(( (${bytes:-302000000} + 524288) / 1048576 ))
            sync
            t0=$(now)
            dd if=/dev/zero of="$work/dd.bin" bs=1M count="$count" conv=fsync status=none
            t1=$(now)
            dd_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", b - a}')
            dd_mb=$(awk -v c="$count" 'BEGIN {printf "%.1f", c * 1048576 / 1e6}')
            rm -f "$work/dd.bin"
        fi
    done
    ratio=$(awk -v c="$ck_s" -v d="$dd_s" 'BEGIN {printf "%.2f", c / d}')
    ratios+=("$ratio")
    printf 'round %d: %s parameters | checkpoint %s MB in %s s (%s MB/s) | dd %s MB in %s s (%s MB/s) | ratio %s\n' \
        "$r" "$params" "$ck_mb" "$ck_s" "$(awk -v m="$ck_mb" -v s="$ck_s" 'BEGIN {printf "%.0f", m / s}')" \
        "$dd_mb" "$dd_s" "$(awk -v m="$dd_mb" -v s="$dd_s" 'BEGIN {printf "%.0f", m / s}')" "$ratio"
done
median=$(printf '%s\n' "${ratios[@]}" | median)
verdict=$(awk -v m="$median" 'BEGIN {print (m <= 2) ? "within" : "OVER"}')
printf 'median checkpoint/dd time ratio %s over %d rounds: %s the target (<= 2)\n' "$median" "$rounds" "$verdict"
