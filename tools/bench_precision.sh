#!/usr/bin/env bash
# Training throughput of the three GEMM set-ups side by side (docs/scale.md §7):
# fp32 on OpenBLAS (the default), fp32 on oneDNN (train.gemm = onednn) and bf16
# mixed precision (train.precision = bf16). Each round runs all three, starting
# with a different one each round, so that a noisy neighbour on a shared
# machine hits them alike; the medians over rounds are printed with their
# ratios to fp32/OpenBLAS. Then build/bench_gemm measures the engines' GFLOP/s
# at the same config's shapes, and the achieved training GFLOP/s is stated as a
# fraction of the bf16 GEMM peak (bench_gemm's "bf16-preconv": the matmul on
# pre-converted operands).
#
#   tools/bench_precision.sh [CONFIG.ini] [ROUNDS] [-- extra momfmm bench args]
#   e.g. tools/bench_precision.sh configs/bench_d256.ini 5
#        tools/bench_precision.sh configs/bench_fmm.ini 3 -- --set data.seq_len=16384 \
#            --set model.max_seq_len=16384 --steps 3
# Environment: MOMFMM (default build/momfmm), BENCH_GEMM (default
# build/bench_gemm; empty to skip), THREADS (default 1).
set -euo pipefail
config=${1:-configs/bench_d256.ini}
rounds=${2:-5}
shift $(($# < 2 ? $# : 2))
[[ ${1:-} == -- ]] && shift
extra=("$@")
momfmm=${MOMFMM:-build/momfmm}
bench_gemm=${BENCH_GEMM-build/bench_gemm}
threads=${THREADS:-1}
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads

labels=(fp32-openblas fp32-onednn bf16-onednn)
sets=("" "--set train.gemm=onednn" "--set train.precision=bf16")
declare -A tps gflops
echo "bench_precision: $config, $rounds rounds, $threads thread(s), load: $(uptime | sed 's/.*load average: //')"
for ((r = 0; r < rounds; r++)); do
  for ((i = 0; i < 3; i++)); do
    v=$(((r + i) % 3))
    # shellcheck disable=SC2086
    line=$("$momfmm" bench "$config" ${sets[v]} "${extra[@]}" | grep '^bench tokens_per_s=')
    t=$(sed -E 's/.*tokens_per_s=([^ ]+).*/\1/' <<<"$line")
    g=$(sed -E 's/.*gflops=([^ ]+).*/\1/' <<<"$line")
    tps[${labels[v]}]+="$t "
    gflops[${labels[v]}]+="$g "
    echo "round $((r + 1)) ${labels[v]}: $t tokens/s, $g GFLOP/s"
  done
done

median() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
base=$(median "${tps[fp32-openblas]}")
echo "median over $rounds rounds:"
for l in "${labels[@]}"; do
  t=$(median "${tps[$l]}")
  g=$(median "${gflops[$l]}")
  printf '  %-14s tokens/s %10.1f  GFLOP/s %7.2f  x%.3f vs fp32-openblas\n' "$l" "$t" "$g" \
    "$(awk -v a="$t" -v b="$base" 'BEGIN {print a / b}')"
done

if [[ -n $bench_gemm && -x $bench_gemm ]]; then
  peak=$("$bench_gemm" "$config" 5 | awk '/^all products/ {print $(NF)}')
  bf16_gf=$(median "${gflops[bf16-onednn]}")
  echo "bf16 GEMM peak at these shapes (bench_gemm, bf16-preconv, all products): $peak GFLOP/s"
  awk -v a="$bf16_gf" -v p="$peak" 'BEGIN {printf "bf16 training reaches %.0f%% of it\n", 100 * a / p}'
fi
echo "load at the end: $(uptime | sed 's/.*load average: //')"
