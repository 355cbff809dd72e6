#!/usr/bin/env bash
# FMM vs softmax attention as the sequence grows (README, "FMM attention and long sequences"):
# `momfmm bench` at T = 1k, 4k, 16k, 64k, batch 1, d 256, 4 layers, 1
# thread; prints a Markdown table of tokens/s, ms per step, time per token
# relative to T = 1k, and peak RSS. Softmax stops where momfmm refuses it
# (its T x T attention weights would not fit in memory) or where a step
# would pass 10 minutes.
# Usage: tools/bench_fmm_scaling.sh [BINARY] [T ...]
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/momfmm}
shift || true
lengths=("$@")
[ ${#lengths[@]} -gt 0 ] || lengths=(1024 4096 16384 65536)
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
echo "| attention | T | tokens/s | ms/step | time per token vs T=1k | peak RSS (MB) | note |"
echo "|---|---|---|---|---|---|---|"
for kind in fmm softmax; do
  base=""
  stopped=""
  for T in "${lengths[@]}"; do
    if [ -n "$stopped" ]; then
      echo "| $kind | $T | — | — | — | — | not run: $stopped |"
      continue
    fi
    steps=3
    [ "$T" -ge 16384 ] && steps=2
    out=$(timeout 1800 "$bin" bench configs/bench_fmm.ini --steps "$steps" --set attention.kind="$kind" \
          --set data.seq_len="$T" --set model.max_seq_len="$T" 2>&1)
    rc=$?
    line=$(grep -o 'bench tokens_per_s=.*' <<<"$out")
    if [ $rc -ne 0 ] || [ -z "$line" ]; then
      why=$(grep -oE "needs [0-9]+% of the available memory[^:]*" <<<"$out" || true)
      [ $rc -eq 124 ] && why="timed out"
      stopped="${why:-exit $rc} at T=$T"
      echo "| $kind | $T | — | — | — | — | ${why:-failed (exit $rc)} |"
      continue
    fi
    tps=$(sed -E 's/.*tokens_per_s=([0-9.]+).*/\1/' <<<"$line")
    ms=$(sed -E 's/.*ms_per_step=([0-9.]+).*/\1/' <<<"$line")
    rss=$(sed -E 's/.*peak_rss_mb=([0-9.]+).*/\1/' <<<"$line")
    per_token=$(awk -v ms="$ms" -v T="$T" 'BEGIN { printf "%.6f", ms / T }')
    [ -n "$base" ] || base=$per_token
    rel=$(awk -v a="$per_token" -v b="$base" 'BEGIN { printf "%.2f", a / b }')
    echo "| $kind | $T | $tps | $ms | ${rel}x | $rss | |"
    # a step over 10 minutes stops the series: longer runs are not worth a table row
    awk -v ms="$ms" 'BEGIN { exit !(ms > 600000) }' && stopped="steps over 10 minutes at T=$T"
  done
done
