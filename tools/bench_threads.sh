#!/usr/bin/env bash
# Thread scaling of one rank, side by side (docs/design.md §8.10): `momfmm
# bench` with OMP_NUM_THREADS = 1 and = THREADS (default 2), alternating which
# goes first each round so that a noisy neighbour on a shared machine hits
# both alike. Prints every round (tokens/s and the fraction of the measured
# FMA peak), the medians, the median of the per-round speed-ups and whether
# it reaches 1.9x (the target at two threads, docs/performance.md §9.9).
#
#   tools/bench_threads.sh [CONFIG.ini] [ROUNDS] [-- extra momfmm bench args]
#   e.g. tools/bench_threads.sh configs/bench_d256.ini 5 -- --steps 5
# Environment: MOMFMM (default build/momfmm), THREADS (default 2).
set -euo pipefail
config=${1:-configs/bench_d256.ini}
rounds=${2:-5}
shift $(($# < 2 ? $# : 2))
[[ ${1:-} == -- ]] && shift
extra=("$@")
momfmm=${MOMFMM:-build/momfmm}
threads=${THREADS:-2}
[[ $rounds =~ ^[1-9][0-9]*$ && $threads =~ ^[1-9][0-9]*$ ]] || { echo "bench_threads: ROUNDS and THREADS must be positive integers" >&2; exit 2; }
[ -x "$momfmm" ] || { echo "bench_threads: $momfmm is not an executable (build first, or set MOMFMM)" >&2; exit 2; }

median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

declare -A tps
ratios=""
echo "bench_threads: $config, 1 vs $threads threads, $rounds rounds, load: $(uptime | sed 's/.*load average: //')"
for ((r = 1; r <= rounds; r++)); do
    declare -A this=()
    for t in $( ((r % 2)) && echo "1 $threads" || echo "$threads 1"); do
        out=$(OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t "$momfmm" bench "$config" "${extra[@]}")
        v=$(sed -nE 's/^bench tokens_per_s=([^ ]+).*/\1/p' <<<"$out")
        f=$(sed -nE 's/^bench peak .*fraction_of_peak=([^ ]+).*/\1/p' <<<"$out")
        [ -n "$v" ] || { echo "bench_threads: no 'bench tokens_per_s=' line from momfmm bench:" >&2; echo "$out" >&2; exit 1; }
        tps[$t]+="$v "
        this[$t]=$v
        printf 'round %d: %d thread(s) | %s tokens/s | %s of the FMA peak\n' "$r" "$t" "$v" "$f"
    done
    ratios+="$(awk -v a="${this[$threads]}" -v b="${this[1]}" 'BEGIN {printf "%.3f", a / b}') "
done
m1=$(tr ' ' '\n' <<<"${tps[1]}" | sed '/^$/d' | median)
mt=$(tr ' ' '\n' <<<"${tps[$threads]}" | sed '/^$/d' | median)
speedup=$(tr ' ' '\n' <<<"$ratios" | sed '/^$/d' | median)
verdict=$(awk -v q="$speedup" 'BEGIN {print (q >= 1.9) ? "reaches" : "BELOW"}')
printf 'median tokens/s over %d rounds: 1 thread %s | %d threads %s | speed-up (median of the rounds) %s: %s 1.9x\n' \
    "$rounds" "$m1" "$threads" "$mt" "$speedup" "$verdict"
