#!/usr/bin/env bash
# Runs the experiment suite (configs/experiments/suite.list) locally, one run after the
# other, each under mpirun; then `tools/momfmm_report.py --results` turns the runs into a
# results report (the command is printed at the end, with this run's --runs and --suite).
#
#   tools/run_experiments.sh [--np N] [--only PATTERN] [--steps-scale F] [--full]
#                            [--runs DIR] [--suite FILE] [--momfmm BIN] [--set k=v ...]
#                            [--dry-run] [--list]
#
# --np N           MPI ranks per run (default 2; runs use --oversubscribe).
# --only PATTERN   run only the lines whose NAME matches this extended regular expression
#                  (grep -E), e.g. '^chain_L30_g0(\.2)?_s' or 'copy_T128'.
# --steps-scale F  multiply every run's train.steps by F (rounded, at least 1); a scaled
#                  suite goes to its own run directory (default runs/experiments_xF) so it
#                  never mixes with full-length runs.
# --full           use CONFIG's cluster-size sibling X_full.ini for every line (default run
#                  directory runs/experiments_full).
# --runs DIR       parent of the run directories (default runs/experiments); run NAME
#                  writes DIR/NAME/{ckpt_*.h5,metrics.h5,train.log}.
# --suite FILE     the suite list (default configs/experiments/suite.list): lines
#                  NAME CONFIG [--set section.key=value ...] [--init SOURCE], the
#                  override syntax of momfmm train and of jobs/sweep.sbatch's sweep
#                  lines; --init SOURCE (an earlier line's NAME) fine-tunes from
#                  DIR/SOURCE's final checkpoint (momfmm train --init).
# --momfmm BIN     the binary (default build/momfmm, or $MOMFMM).
# --set k=v        extra override applied after the line's own (repeatable; for tests).
# --dry-run        print each command instead of running it; --list prints the names.
#
# A run whose final checkpoint (DIR/NAME/ckpt_<steps>.h5) exists is skipped; any other
# run starts with --resume auto, so an interrupted suite continues where it stopped. A line
# with --init SOURCE starts with --init DIR/SOURCE/ckpt_<SOURCE's steps>.h5 until it has a
# checkpoint of its own; an unfinished SOURCE runs first, selected or not (--only).
# Paths are relative to the repository root (the script changes there first). At the end
# it prints the command that writes the results report of exactly these runs (--runs,
# --suite) to DIR/RESULTS.md; the repository's RESULTS.md changes only with --out RESULTS.md.
# Stopping: SIGINT (Ctrl-C), SIGTERM, SIGHUP or SIGUSR1 to this script (or to its process
# group, as Ctrl-C and `timeout` send) stops the suite after the running run has written a
# checkpoint of its current step: the script asks that run's mpirun with a SIGUSR1, and no
# later run starts. Running the same command again resumes it (docs/cli.md §5).
# Exit: 0 all selected runs finished or were skipped; 1 some run failed (the others still
# run; see DIR/NAME/train.log); 2 usage or suite-list error; 128 + N stopped by signal N
# (130 for SIGINT, 143 for SIGTERM).
set -u
me=run_experiments.sh
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
usage() { sed -n '6,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
# --help: the whole header (usage, options, exit codes) on stdout, exit 0.
help() { sed -n '2,/^set -u/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0; }
# die, ini_steps and run_step: the functions shared with the job scripts
# shellcheck source-path=SCRIPTDIR source=../jobs/momfmm_lib.sh
. "$root/jobs/momfmm_lib.sh" || { echo "$me: cannot read $root/jobs/momfmm_lib.sh" >&2; exit 2; }

np=2 only='' scale=1 full=0 runs='' suite=configs/experiments/suite.list
bin=${MOMFMM:-build/momfmm} dry=0 list=0
extra=()
while [ $# -gt 0 ]; do
    case $1 in
    --np) [ $# -ge 2 ] || usage; np=$2; shift 2 ;;
    --only) [ $# -ge 2 ] || usage; only=$2; shift 2 ;;
    --steps-scale) [ $# -ge 2 ] || usage; scale=$2; shift 2 ;;
    --full) full=1; shift ;;
    --runs) [ $# -ge 2 ] || usage; runs=$2; shift 2 ;;
    --suite) [ $# -ge 2 ] || usage; suite=$2; shift 2 ;;
    --momfmm) [ $# -ge 2 ] || usage; bin=$2; shift 2 ;;
    --set) [ $# -ge 2 ] || usage; [[ $2 == *.*=* ]] || die "--set $2: expected section.key=value"
        extra+=(--set "$2"); shift 2 ;;
    --dry-run) dry=1; shift ;;
    --list) list=1; shift ;;
    -h | --help) help ;;
    *) echo "$me: unknown argument '$1'" >&2; usage ;;
    esac
done
[[ $np =~ ^[1-9][0-9]*$ ]] || die "--np $np: expected a positive integer"
[[ $scale =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)$ ]] && awk -v s="$scale" 'BEGIN{exit !(s > 0)}' ||
    die "--steps-scale $scale: expected a positive number"
scaled=0
awk -v s="$scale" 'BEGIN{exit !(s != 1)}' && scaled=1
caller_dir=$(pwd)
cd "$root" || die "cannot enter $root"
if [ -z "$runs" ]; then
    runs=runs/experiments
    [ "$full" = 1 ] && runs=runs/experiments_full
    [ "$scaled" = 1 ] && runs=${runs}_x$scale
fi
[ -r "$suite" ] || die "suite list $suite: not readable from $root"
case $bin in /*) ;; *) bin=$root/$bin ;; esac
[ "$dry" = 1 ] || [ "$list" = 1 ] || [ -x "$bin" ] ||
    die "momfmm binary $bin not found: build it (cmake --build build -j2) or pass --momfmm"

# ---- parse the suite ----
names=() configs=() sets=() inits=()
declare -A seen=() index=()
n=0
while IFS= read -r line || [ -n "$line" ]; do
    n=$((n + 1))
    line=${line%$'\r'}
    [[ $line =~ ^[[:space:]]*(#|$) ]] && continue
    read -r -a words <<<"$line"
    [ ${#words[@]} -ge 2 ] || die "$suite:$n: expected 'NAME CONFIG [--set section.key=value ...] [--init SOURCE]'"
    name=${words[0]} config=${words[1]}
    [[ $name =~ ^[A-Za-z0-9_.+-]+$ ]] || die "$suite:$n: run name '$name' has characters other than A-Z a-z 0-9 _ . + -"
    [ -z "${seen[$name]:-}" ] || die "$suite:$n: run name '$name' repeats line ${seen[$name]}"
    seen[$name]=$n
    rest=("${words[@]:2}") line_sets=() src=''
    i=0
    while [ $i -lt ${#rest[@]} ]; do
        if [ "${rest[$i]}" = --init ] && [ $((i + 1)) -lt ${#rest[@]} ]; then
            [ -z "$src" ] || die "$suite:$n: --init given twice (a run starts from one checkpoint)"
            src=${rest[$((i + 1))]}
            [ -n "${seen[$src]:-}" ] && [ "$src" != "$name" ] ||
                die "$suite:$n: --init $src: names no earlier line (a line starts from the final checkpoint of one above it)"
            i=$((i + 2))
            continue
        fi
        [ "${rest[$i]}" = --set ] && [ $((i + 1)) -lt ${#rest[@]} ] && [[ ${rest[$((i + 1))]} == *.*=* ]] ||
            die "$suite:$n: expected '--set section.key=value' or '--init SOURCE' at '${rest[$i]}' (overrides are written as for momfmm train)"
        [[ ${rest[$((i + 1))]} == train.out_dir=* ]] && die "$suite:$n: train.out_dir is set by the runner"
        line_sets+=("${rest[$i]}" "${rest[$((i + 1))]}")
        i=$((i + 2))
    done
    index[$name]=${#names[@]}
    names+=("$name")
    configs+=("$config")
    sets+=("${line_sets[*]}")
    inits+=("$src")
done <"$suite"

# line_config I VAR, line_steps I VAR and line_final I VAR set VAR to line I's config file
# (its _full.ini sibling with --full), its train.steps (the line's, --set's or
# --steps-scale's, else the config's) and its final checkpoint, the file whose presence
# means it finished. They run in this shell rather than in $(...), and read each config's
# train.steps once (config_steps): as commands substituted per line they forked awk and
# subshells about ten times a line, and --dry-run over the suite's 200 lines took 15 s.
# Their locals carry the function's prefix (_lc_, _ls_, _lf_), so that no VAR a caller
# names, nor one of them names for another, is shadowed by a local.
declare -A config_steps=()
line_config() {
    local _lc_path=${configs[$1]}
    [ "$full" = 1 ] && [ -r "${_lc_path%.ini}_full.ini" ] && _lc_path=${_lc_path%.ini}_full.ini
    printf -v "$2" '%s' "$_lc_path"
}
line_steps() {
    local _ls_sets _ls_j _ls_config _ls_steps
    read -r -a _ls_sets <<<"${sets[$1]}"
    line_config "$1" _ls_config
    [ -n "${config_steps[$_ls_config]+set}" ] || config_steps[$_ls_config]=$(ini_steps "$_ls_config")
    _ls_steps=${config_steps[$_ls_config]}
    for ((_ls_j = 0; _ls_j < ${#_ls_sets[@]}; _ls_j += 2)); do
        [[ ${_ls_sets[$((_ls_j + 1))]} == train.steps=* ]] && _ls_steps=${_ls_sets[$((_ls_j + 1))]#train.steps=}
    done
    for ((_ls_j = 0; _ls_j < ${#extra[@]}; _ls_j += 2)); do
        [[ ${extra[$((_ls_j + 1))]} == train.steps=* ]] && _ls_steps=${extra[$((_ls_j + 1))]#train.steps=}
    done
    _ls_steps=${_ls_steps:-1000}
    [ "$scaled" = 1 ] && _ls_steps=$(awk -v n="$_ls_steps" -v s="$scale" 'BEGIN{v=int(n*s+0.5); print (v<1?1:v)}')
    printf -v "$2" '%s' "$_ls_steps"
}
line_final() {
    local _lf_steps
    line_steps "$1" _lf_steps
    printf -v "$2" '%s' "$runs/${names[$1]}/$(checkpoint_name "$_lf_steps")"
}

# --only: one grep over every name (its line numbers are the indices plus one); a
# pattern grep -E cannot read is named, once
selected=()
if [ -z "$only" ]; then
    selected=("${!names[@]}")
else
    matches=$(printf '%s\n' "${names[@]}" | grep -nE -- "$only" 2>&1)
    case $? in
    0) ;;
    1) matches= ;;
    *) die "--only '$only': not an extended regular expression (grep -E: ${matches#grep: })" ;;
    esac
    while IFS=: read -r number _; do
        [ -n "$number" ] && selected+=($((number - 1)))
    done <<<"$matches"
fi
[ ${#selected[@]} -gt 0 ] || die "no suite line matches --only '$only'"
# A line with --init SOURCE needs SOURCE's final checkpoint: an unfinished SOURCE joins the
# selection, ahead of it (suite order: SOURCE is an earlier line).
declare -A chosen=()
config='' steps='' final='' source_final='' # set by line_config, line_steps, line_final
for i in "${selected[@]}"; do chosen[$i]=1; done
grew=1
while [ "$grew" = 1 ]; do
    grew=0
    for i in "${!chosen[@]}"; do
        src=${inits[$i]}
        [ -n "$src" ] || continue
        j=${index[$src]}
        line_final "$j" source_final
        [ -n "${chosen[$j]:-}" ] || [ -e "$source_final" ] || { chosen[$j]=1; grew=1; }
    done
done
mapfile -t selected < <(printf '%s\n' "${!chosen[@]}" | sort -n)
if [ "$list" = 1 ]; then
    for i in "${selected[@]}"; do echo "${names[$i]}"; done
    exit 0
fi

export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1}
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-$OMP_NUM_THREADS}

# ---- stop requests (docs/cli.md §5) ----
# mpirun (Open MPI 4.1.4) answers a SIGINT or SIGTERM by killing its ranks about 2 s later,
# before a step longer than that can end and write its stop checkpoint; a SIGUSR1 it forwards
# to the ranks and waits for them. So each mpirun runs in a process group of its own (set -m in
# run_step with GROUP 1), out of reach of a Ctrl-C or `timeout`, and this script turns the signals it
# gets into a SIGUSR1 to it, repeated every 2 s until momfmm acknowledges (STOPPED), as the
# job scripts do: mpirun drops a signal that comes before it has started the ranks.
caught=
step_pid=
stop_request() {
    caught=$1
    echo "$me: got SIG$1 at $(date '+%H:%M:%S'): the running run checkpoints and stops, no further run starts"
    [ -n "$step_pid" ] && kill -USR1 "$step_pid" 2>/dev/null
}
for sig in INT TERM HUP USR1; do
    trap "stop_request $sig" "$sig"
done

# Each run goes through run_step (jobs/momfmm_lib.sh): in a process group of its own, its
# output appended to DIR/NAME/train.log, stop requests forwarded; it sets rc.

failed=() done_n=0 skipped=0 k=0
start_all=$(date +%s)
for i in "${selected[@]}"; do
    [ -n "$caught" ] && break
    k=$((k + 1))
    name=${names[$i]}
    line_config "$i" config
    read -r -a line_sets <<<"${sets[$i]}"
    [ -r "$config" ] || { echo "$me: [$k/${#selected[@]}] $name: config $config not readable" >&2; failed+=("$name"); continue; }
    line_steps "$i" steps
    scale_set=()
    [ "$scaled" = 1 ] && scale_set=(--set "train.steps=$steps")
    out=$runs/$name
    line_final "$i" final
    # a line with --init starts from its source's final checkpoint; once it has a
    # checkpoint of its own, it resumes from that (momfmm takes one or the other)
    start=(--resume auto)
    if [ -n "${inits[$i]}" ] && ! newest_checkpoint "$out" >/dev/null; then
        line_final "${index[${inits[$i]}]}" source_final
        start=(--init "$source_final")
        if [ "$dry" = 0 ] && [ ! -e "${start[1]}" ]; then
            echo "$me: [$k/${#selected[@]}] $name: starts from ${inits[$i]}'s final checkpoint ${start[1]}, which is missing (${inits[$i]} did not finish)" >&2
            failed+=("$name")
            continue
        fi
    fi
    cmd=(mpirun --oversubscribe -np "$np" "$bin" train "$config" "${line_sets[@]}" "${extra[@]}"
         "${scale_set[@]}" --set "train.out_dir=$out" "${start[@]}")
    if [ "$dry" = 1 ]; then
        echo "${cmd[*]}"
        continue
    fi
    if [ -e "$final" ]; then
        echo "$me: [$k/${#selected[@]}] $name: done ($final exists), skipped"
        skipped=$((skipped + 1))
        continue
    fi
    mkdir -p "$out" || { failed+=("$name"); continue; }
    if [ -L "$out/train.log" ] || { [ -e "$out/train.log" ] && [ ! -f "$out/train.log" ]; }; then
        echo "$me: [$k/${#selected[@]}] $name: $out/train.log is a symbolic link or not a regular file: not appended to" >&2
        failed+=("$name")
        continue
    fi
    t0=$(date +%s)
    echo "$me: [$k/${#selected[@]}] $name: ${cmd[*]}"
    {
        echo "# $(date '+%Y-%m-%dT%H:%M:%S') $(uptime)"
        echo "# ${cmd[*]}"
    } >>"$out/train.log"
    run_step "$out" "$out/train.log" 1 "${cmd[@]}"
    t1=$(date +%s)
    echo "# exit $rc after $((t1 - t0)) s" >>"$out/train.log"
    if [ -n "$caught" ] && [ ! -e "$final" ]; then
        if [ -f "$out/STOPPED" ]; then
            echo "$me: [$k/${#selected[@]}] $name: stopped after $((t1 - t0)) s with a checkpoint ($(head -n 1 "$out/STOPPED")); the same command resumes it"
        else
            echo "$me: [$k/${#selected[@]}] $name: stopped after $((t1 - t0)) s (exit $rc) without a stop checkpoint; it resumes from its newest checkpoint in $out" >&2
        fi
    elif [ $rc -ne 0 ] || [ ! -e "$final" ]; then
        echo "$me: [$k/${#selected[@]}] $name: FAILED (exit $rc, $((t1 - t0)) s); last lines of $out/train.log:" >&2
        tail -n 5 "$out/train.log" >&2
        failed+=("$name")
    else
        echo "$me: [$k/${#selected[@]}] $name: finished in $((t1 - t0)) s"
        done_n=$((done_n + 1))
    fi
done
[ "$dry" = 1 ] && exit 0
echo "$me: $done_n run, $skipped skipped, ${#failed[@]} failed in $(($(date +%s) - start_all)) s (runs in $runs)"
[ ${#failed[@]} -gt 0 ] && echo "$me: failed: ${failed[*]}" >&2
if [ -n "$caught" ]; then
    echo "$me: stopped by SIG$caught; the same command continues the suite"
    exit $((128 + $(kill -l "$caught")))
fi
[ ${#failed[@]} -gt 0 ] && exit 1
# The report of exactly these runs: same --runs and --suite, into the run directory (not
# the repository's RESULTS.md, which only --out RESULTS.md rewrites).
next=(/usr/bin/python3 tools/momfmm_report.py --results --runs "$runs")
[ "$suite" = configs/experiments/suite.list ] || next+=(--suite "$suite")
next+=(--out "$runs/RESULTS.md")
where=
[ "$caller_dir" = "$root" ] || where="cd $(printf '%q' "$root") && "
echo "$me: next, the results report of these runs: $where$(printf '%q ' "${next[@]}" | sed 's/ $//')"
# runs/ is not committed and may not outlive this machine: the finished runs' results digests
# do (docs/design.md §8.8; configs/experiments/README.md, "Results digests").
[ "$runs" = runs/experiments ] && [ "$suite" = configs/experiments/suite.list ] &&
    echo "$me: to keep them beyond this machine: ${where}/usr/bin/python3 tools/momfmm_report.py --results --save-digests --no-figures >/dev/null && git add results/experiments"
exit 0
