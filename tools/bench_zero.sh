#!/usr/bin/env bash
# Training throughput of ZeRO-1 against the replicated optimizer, side by side
# (docs/scale.md §7): `momfmm bench` under mpirun -np N with dist.zero = 0 and
# with dist.zero = 1, alternating which goes first each round so that a noisy
# neighbour on a shared machine hits both alike. Prints every round, the
# medians, their ratio and whether zero = 1 is within 3% of zero = 0 (the
# target for ZeRO-1, docs/performance.md §9.6), and the bytes
# per parameter of each.
#
#   tools/bench_zero.sh [CONFIG.ini] [ROUNDS] [NP] [-- extra momfmm bench args]
#   e.g. tools/bench_zero.sh configs/bench_d256.ini 7 2 -- --steps 8
# Environment: MOMFMM (default build/momfmm), THREADS (per rank, default 1).
set -euo pipefail
config=${1:-configs/bench_d256.ini}
rounds=${2:-7}
np=${3:-2}
shift $(($# < 3 ? $# : 3))
[[ ${1:-} == -- ]] && shift
extra=("$@")
momfmm=${MOMFMM:-build/momfmm}
threads=${THREADS:-1}
refuse() { echo "bench_zero: $*" >&2; exit 2; }
[[ $rounds =~ ^[1-9][0-9]*$ && $np =~ ^[1-9][0-9]*$ ]] || refuse "ROUNDS and NP must be positive integers"
[ -f "$momfmm" ] && [ -x "$momfmm" ] || refuse "$momfmm is not an executable (build first, or set MOMFMM)"
[ -e "$config" ] || refuse "$config: no such config file"
[ -f "$config" ] || refuse "$config: not a regular file (a config is INI text)"
[[ $threads =~ ^[1-9][0-9]{0,3}$ ]] || refuse "THREADS='$threads': expected a positive integer"
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

declare -A tps memory
echo "bench_zero: $config, np $np x $threads thread(s), $rounds rounds, load: $(uptime | sed 's/.*load average: //')"
for ((r = 1; r <= rounds; r++)); do
    for zero in $( ((r % 2)) && echo "0 1" || echo "1 0"); do
        out=$(mpirun --oversubscribe -np "$np" "$momfmm" bench "$config" --set dist.zero="$zero" "${extra[@]}")
        t=$(sed -nE 's/^bench tokens_per_s=([^ ]+).*/\1/p' <<<"$out")
        [ -n "$t" ] || { echo "bench_zero: no 'bench tokens_per_s=' line from momfmm bench:" >&2; echo "$out" >&2; exit 1; }
        tps[$zero]+="$t "
        memory[$zero]=$(sed -nE 's/^bench memory (.*)/\1/p' <<<"$out")
        printf 'round %d: zero %d | %s tokens/s\n' "$r" "$zero" "$t"
    done
done
m0=$(tr ' ' '\n' <<<"${tps[0]}" | sed '/^$/d' | median)
m1=$(tr ' ' '\n' <<<"${tps[1]}" | sed '/^$/d' | median)
ratio=$(awk -v a="$m1" -v b="$m0" 'BEGIN {printf "%.3f", a / b}')
verdict=$(awk -v q="$ratio" 'BEGIN {print (q >= 0.97) ? "within" : "OUTSIDE"}')
printf 'memory zero 0: %s\nmemory zero 1: %s\n' "${memory[0]}" "${memory[1]}"
printf 'median tokens/s over %d rounds: zero 0 %s | zero 1 %s | ratio %s: %s 3%% of zero 0\n' \
    "$rounds" "$m0" "$m1" "$ratio" "$verdict"
