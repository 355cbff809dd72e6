#!/usr/bin/env bash
# FMM vs exact softmax attention as the sequence grows (docs/performance.md
# §9.7): `momfmm bench` of configs/bench_fmm.ini (batch 1,
# d 256, 8 heads, 4 layers, 1 thread) at T = 1k, 4k, 16k, 64k for FMM,
# softmax tiled (attention.impl = tiled, linear memory) and softmax dense
# (the T x T probabilities kept); prints a Markdown table of tokens/s,
# ms per step, time per token relative to the kind's first T, peak RSS, and
# the CPU ms of the step with tokens per CPU second (on a machine shared with
# other work, wall time includes waiting for a core; CPU time does not).
# A kind stops where momfmm refuses it (it would not fit in memory) or after
# a step of over 10 minutes. With ROUNDS > 1 the kinds alternate at each T
# and the medians are shown.
# Usage: tools/bench_fmm_scaling.sh [BINARY] [T ...]
# Environment: KINDS (default "fmm softmax-tiled softmax-dense"), ROUNDS (1).
set -uo pipefail
refuse() { echo "bench_fmm_scaling: $*" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
case ${1:-} in -*) refuse "$1: not an option; usage: tools/bench_fmm_scaling.sh [BINARY] [T ...]" ;; esac
bin=${1:-$root/build/momfmm}
[[ $bin == /* ]] || bin=$PWD/$bin # BINARY as the caller named it, before the cd below
shift || true
lengths=("$@")
[ ${#lengths[@]} -gt 0 ] || lengths=(1024 4096 16384 65536)
read -r -a kinds <<<"${KINDS:-fmm softmax-tiled softmax-dense}"
rounds=${ROUNDS:-1}
cd "$root" || exit 3
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

settings() { # kind -> its --set options
  case $1 in
    fmm) echo "--set attention.kind=fmm" ;;
    softmax-tiled) echo "--set attention.kind=softmax --set attention.impl=tiled" ;;
    softmax-dense) echo "--set attention.kind=softmax --set attention.impl=dense" ;;
    *) refuse "KINDS: unknown kind '$1' (fmm softmax-tiled softmax-dense)" ;;
  esac
}

# Every argument checked before the first run (docs/cli.md §5: one line, exit 2)
[ -f "$bin" ] && [ -x "$bin" ] || refuse "$bin: not an executable momfmm binary (BINARY, the first argument)"
for T in "${lengths[@]}"; do [[ $T =~ ^[1-9][0-9]{0,8}$ ]] || refuse "T '$T': expected a positive integer"; done
[[ $rounds =~ ^[1-9][0-9]{0,3}$ ]] || refuse "ROUNDS='$rounds': expected a positive integer"
[ ${#kinds[@]} -gt 0 ] || refuse "KINDS names no kind (fmm softmax-tiled softmax-dense)"
for kind in "${kinds[@]}"; do settings "$kind" >/dev/null; done # an unknown kind exits 2 here

declare -A stopped base
echo "| attention | T | tokens/s | ms/step | time per token vs its first T | peak RSS (MB) | CPU ms/step | tokens per CPU s | note |"
echo "|---|---|---|---|---|---|---|---|---|"
for T in "${lengths[@]}"; do
  declare -A tps=() ms=() rss=() cpu=()
  steps=3
  [ "$T" -ge 16384 ] && steps=1
  for ((r = 1; r <= rounds; r++)); do
    for kind in "${kinds[@]}"; do
      [ -n "${stopped[$kind]:-}" ] && continue
      # shellcheck disable=SC2046
      out=$(timeout 3600 "$bin" bench configs/bench_fmm.ini --steps "$steps" $(settings "$kind") \
            --set data.seq_len="$T" --set model.max_seq_len="$T" 2>&1)
      rc=$?
      line=$(grep -o 'bench tokens_per_s=.*' <<<"$out")
      if [ $rc -ne 0 ] || [ -z "$line" ]; then
        why=$(grep -oE "needs [0-9]+% of the available memory[^:]*" <<<"$out" || true)
        [ $rc -eq 124 ] && why="timed out"
        stopped[$kind]="${why:-exit $rc} at T=$T"
        echo "| $kind | $T | — | — | — | — | — | — | ${why:-failed (exit $rc)} |"
        continue
      fi
      tps[$kind]+="$(sed -E 's/.*tokens_per_s=([0-9.]+).*/\1/' <<<"$line") "
      ms[$kind]+="$(sed -E 's/.* ms_per_step=([0-9.]+).*/\1/' <<<"$line") "
      rss[$kind]+="$(sed -E 's/.*peak_rss_mb=([0-9.]+).*/\1/' <<<"$line") "
      cpu[$kind]+="$(sed -E 's/.*cpu_ms_per_step=([0-9.]+).*/\1/' <<<"$line") "
    done
  done
  for kind in "${kinds[@]}"; do
    [ -n "${tps[$kind]:-}" ] || {
      [ -n "${stopped[$kind]:-}" ] && [[ ${stopped[$kind]} != *"T=$T" ]] && echo "| $kind | $T | — | — | — | — | — | — | not run: ${stopped[$kind]} |"
      continue
    }
    t=$(tr ' ' '\n' <<<"${tps[$kind]}" | sed '/^$/d' | median)
    m=$(tr ' ' '\n' <<<"${ms[$kind]}" | sed '/^$/d' | median)
    mem=$(tr ' ' '\n' <<<"${rss[$kind]}" | sed '/^$/d' | median)
    c=$(tr ' ' '\n' <<<"${cpu[$kind]}" | sed '/^$/d' | median)
    cpu_tps=$(awk -v c="$c" -v T="$T" 'BEGIN { printf "%.1f", T / (c / 1000) }')
    per_token=$(awk -v ms="$m" -v T="$T" 'BEGIN { printf "%.6f", ms / T }')
    [ -n "${base[$kind]:-}" ] || base[$kind]=$per_token
    rel=$(awk -v a="$per_token" -v b="${base[$kind]}" 'BEGIN { printf "%.2f", a / b }')
    echo "| $kind | $T | $t | $m | ${rel}x | $mem | $c | $cpu_tps | |"
    # a step over 10 minutes stops the kind: longer runs are not worth a table row
    awk -v ms="$m" 'BEGIN { exit !(ms > 600000) }' && stopped[$kind]="steps over 10 minutes at T=$T"
  done
done
