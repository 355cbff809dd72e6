#!/usr/bin/env bash
# Collects the runs of a sweep (jobs/sweep.sbatch) into one Markdown report:
# a table of array task, overrides and run directory, then the table that
# tools/momfmm_report.py prints for the run directories.
#
#   jobs/collect_sweep.sh [--runs DIR] [--out FILE] ARRAY_JOB_ID
#
# --runs: where the sweep put its runs (default $MOMFMM_RUNS or runs, relative
# to the current directory, i.e. the directory the sweep was submitted from).
# --out FILE (or -o FILE): also write the report to FILE. MOMFMM_REPORT overrides
# the report tool. The overrides column shows each task's sweep line as written
# (`--set section.key=value ...`, see jobs/sweep.sbatch).
# Exit: 0 report written; 1 no runs found or the report tool failed; 2 usage;
# 3 the report tool is missing.
set -u
me=collect_sweep.sh
usage() { echo "usage: jobs/$me [--runs DIR] [--out FILE] ARRAY_JOB_ID" >&2; exit 2; }
help() { sed -n '2,/^set -u/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
runs=${MOMFMM_RUNS:-runs}
out=
id=
while [ $# -gt 0 ]; do
    case $1 in
    --runs) [ $# -ge 2 ] || usage; runs=$2; shift 2 ;;
    -o | --out) [ $# -ge 2 ] || usage; out=$2; shift 2 ;;
    -h | --help) help ;;
    -*) echo "$me: unknown option $1" >&2; usage ;;
    *) [ -z "$id" ] || usage; id=$1; shift ;;
    esac
done
[[ $id =~ ^[0-9]+$ ]] || { echo "$me: ARRAY_JOB_ID must be a number (the id sbatch printed), got '${id}'" >&2; usage; }

# shellcheck source-path=SCRIPTDIR source=momfmm_lib.sh
. "$here/momfmm_lib.sh" || { echo "$me: cannot read $here/momfmm_lib.sh" >&2; exit 2; }
report_tool=${MOMFMM_REPORT:-$here/../tools/momfmm_report.py}
if [ ! -f "$report_tool" ]; then
    echo "$me: report tool $report_tool not found (tools/momfmm_report.py of the repository; set MOMFMM_REPORT to use another)" >&2
    exit 3
fi
[ -d "$runs" ] || { echo "$me: runs directory $runs not found (use --runs DIR)" >&2; exit 1; }

# Task -> run dir and overrides: from the .tasks manifests (the last line of a
# task wins: a requeued task appends again), else from the directory names.
declare -A dir_of=() sets_of=()
shopt -s nullglob
for manifest in "$runs"/*-"$id".tasks; do
    while IFS=$'\t' read -r task dir sets; do
        [[ $task =~ ^[0-9]+$ ]] || continue
        dir_of[$task]=$dir
        sets_of[$task]=$sets
    done <"$manifest"
done
if [ ${#dir_of[@]} -eq 0 ]; then
    for dir in "$runs"/*-"$id"_*/; do
        dir=${dir%/}
        task=${dir##*_}
        [[ $task =~ ^[0-9]+$ ]] || continue
        dir_of[$task]=$dir
        sets_of[$task]="?"
    done
fi
if [ ${#dir_of[@]} -eq 0 ]; then
    echo "$me: no runs of array job $id in $runs (no $runs/*-$id.tasks, no $runs/*-${id}_<task>/)" >&2
    exit 1
fi
if command -v squeue >/dev/null 2>&1; then
    left=$(squeue -h -r -j "$id" -o '%i %T' 2>/dev/null)
    [ -z "$left" ] || echo "$me: warning: array job $id still has tasks queued or running:" $left >&2
fi

mapfile -t tasks < <(printf '%s\n' "${!dir_of[@]}" | sort -n)
dirs=()
report=$(mktemp)
trap 'rm -f "$report"' EXIT
{
    echo "# Sweep $id: ${#tasks[@]} runs"
    echo
    echo "| task | overrides | run directory | newest checkpoint |"
    echo "|---|---|---|---|"
    for task in "${tasks[@]}"; do
        dir=${dir_of[$task]}
        # by step, not by the glob's text order (momfmm_lib.sh)
        if newest=$(newest_checkpoint "$dir"); then
            dirs+=("$dir")
        else
            newest="(none)"
        fi
        echo "| $task | ${sets_of[$task]} | $dir | $newest |"
    done
    echo
} >"$report"
if [ ${#dirs[@]} -eq 0 ]; then
    cat "$report"
    echo "$me: no run of array job $id has a checkpoint yet" >&2
    exit 1
fi
if ! /usr/bin/python3 "$report_tool" "${dirs[@]}" >>"$report"; then
    cat "$report"
    echo "$me: $report_tool failed on ${dirs[*]}" >&2
    exit 1
fi
cat "$report"
if [ -n "$out" ]; then
    # never through a link or onto a special file (docs/cli.md §5, as every output)
    if [ -L "$out" ] || { [ -e "$out" ] && [ ! -f "$out" ]; }; then
        echo "$me: --out $out is a symbolic link or not a regular file: not written" >&2
        exit 2
    fi
    cp "$report" "$out" || exit 1
    echo "$me: report written to $out" >&2
fi
