# shellcheck shell=bash
# The functions the job scripts share (train.sbatch, train_srun.sbatch,
# sweep.sbatch, experiments.sbatch; tools/run_experiments.sh uses run_step and
# ini_steps). Sourced, never run: each job script reads it again at every start,
# so a requeued job starts with the library as it is then. The caller sets
# `me` (its name, for messages) first.
#
# How a job script finds this file (the same block in each, checked by
# tests/slurm/test_slurm.sh): Slurm runs a spooled copy of the script, so it is
# $MOMFMM_JOBS_LIB if set; else momfmm_lib.sh beside the script as run (a
# script run in place: bash jobs/train.sbatch); else beside the script as
# submitted (the Command of `scontrol show job`, less the arguments); else
# jobs/momfmm_lib.sh of the submit directory. Sourcing sets MOMFMM_JOBS_DIR
# (this file's directory) and SLURM_VARIABLES and defines functions.

# The directory of this file, absolute (a job script may change directory after sourcing it)
MOMFMM_JOBS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# shellcheck disable=SC2154 # me: set by the caller
die() { echo "$me: $*" >&2; exit 2; }

# The rank count of this start: the sum of SLURM_TASKS_PER_NODE ("4", "2(x3),1"),
# else SLURM_NTASKS, else "?" (mpirun, outside an allocation, takes -np from
# MPIRUN_FLAGS). Not SLURM_NTASKS first: after `scontrol update JobId=ID
# NumTasks=N` on a requeued job, SLURM_NTASKS (and SLURM_NPROCS) still hold the
# submitted count, and srun, which reads them, would start that many tasks.
# Both are checked by check_slurm_env first.
slurm_ranks() {
    local n=0 e per_node
    IFS=, read -r -a per_node <<<"${SLURM_TASKS_PER_NODE:-}"
    for e in "${per_node[@]}"; do
        if [[ $e =~ ^([0-9]+)\(x([0-9]+)\)$ ]]; then
            n=$((n + 10#${BASH_REMATCH[1]} * 10#${BASH_REMATCH[2]}))
        else
            n=$((n + 10#$e))
        fi
    done
    if [ "$n" -gt 0 ]; then echo "$n"; else echo "${SLURM_NTASKS:-?}"; fi
}

# What each SLURM_* variable that the job scripts (and this file) read must
# hold when it is set: NAME KIND WHAT, one per line. Slurm writes every one
# of them well formed; a value set by hand (a job script run outside Slurm,
# or a site's wrapper) that is not stops the job with one line naming the
# variable and its value, exit 2 (check_slurm_env), before anything starts:
# no "unbound variable", no mpirun without a task count, no thread count
# that momfmm cannot start with.
SLURM_VARIABLES='SLURM_JOB_ID id a job id, a whole number from 1
SLURM_ARRAY_JOB_ID id an array job id, a whole number from 1
SLURM_ARRAY_TASK_ID index an array task index, a whole number from 0
SLURM_RESTART_COUNT index a restart count, a whole number from 0
SLURM_NTASKS count a task count, a whole number from 1
SLURM_TASKS_PER_NODE per_node tasks per node as Slurm writes them (4, or 2(x3),1), at least 1 in all
SLURM_CPUS_PER_TASK cpus CPUs per task, a whole number from 1 to this node'"'"'s CPU count
SLURM_OVERCOMMIT flag 0 or 1
SLURM_JOB_NAME name a job name: not empty, no / and no control character (it names the run directory)
SLURM_SUBMIT_DIR dir an absolute path of an existing directory
SLURM_JOB_NODELIST nodes a node list: not empty, no blank and no control character'

# node_cpus: this node's CPU count (the most threads a rank may get here).
node_cpus() {
    local n
    n=$(getconf _NPROCESSORS_ONLN 2>/dev/null)
    [[ $n =~ ^[1-9][0-9]{0,5}$ ]] || n=1
    echo "$n"
}

# slurm_value_ok KIND VALUE: true if VALUE is a well-formed value of KIND
# (SLURM_VARIABLES). Numbers: decimal without a leading zero (bash's
# arithmetic would read 010 as octal, 08 as an error), at most 10 digits.
slurm_value_ok() {
    local kind=$1 v=$2 e total=0 per_node
    case $kind in
    id | count) [[ $v =~ ^[1-9][0-9]{0,9}$ ]] ;;
    index) [[ $v =~ ^(0|[1-9][0-9]{0,9})$ ]] ;;
    cpus) [[ $v =~ ^[1-9][0-9]{0,5}$ ]] && [ "$v" -le "$(node_cpus)" ] ;;
    flag) [[ $v =~ ^[01]$ ]] ;;
    per_node)
        IFS=, read -r -a per_node <<<"$v"
        [ -n "$v" ] && [[ $v != *, && $v != ,* && $v != *[[:cntrl:]]* ]] || return 1
        for e in "${per_node[@]}"; do
            if [[ $e =~ ^(0|[1-9][0-9]{0,6})\(x([1-9][0-9]{0,6})\)$ ]]; then
                total=$((total + BASH_REMATCH[1] * BASH_REMATCH[2]))
            elif [[ $e =~ ^(0|[1-9][0-9]{0,6})$ ]]; then
                total=$((total + e))
            else
                return 1
            fi
        done
        [ "$total" -gt 0 ] ;;
    name) [ -n "$v" ] && [[ $v != */* && $v != *[[:cntrl:]]* ]] ;;
    dir) [[ $v == /* ]] && [ -d "$v" ] ;;
    nodes) [ -n "$v" ] && [[ $v != *[[:space:][:cntrl:]]* ]] ;;
    *) return 1 ;;
    esac
}

# check_slurm_env: exits 2 on the first SLURM_* variable of SLURM_VARIABLES
# that is set to a value Slurm would not write (one line: the variable, its
# value, what it must be).
check_slurm_env() {
    local name kind what value
    while read -r name kind what; do
        [ -n "${!name+set}" ] || continue
        value=${!name}
        slurm_value_ok "$kind" "$value" && continue
        [ "$kind" = cpus ] && what="${what%this node*}this node's CPU count ($(node_cpus))"
        value=${value//[[:cntrl:]]/?}
        die "$name='$value': expected $what"
    done <<<"$SLURM_VARIABLES"
}

# need_slurm NAME WHY: exits 2 unless the variable NAME is set (WHY: what it is for).
need_slurm() {
    [ -n "${!1+set}" ] || die "$1 is not set: $2 (Slurm sets it in every job; set it when running a job script by hand)"
}

# require_job ARGS: exits 2 unless inside a Slurm job (ARGS: the script's
# arguments, for the message), or if a SLURM_* value is not well formed
# (check_slurm_env).
require_job() {
    [ -n "${SLURM_JOB_ID+set}" ] ||
        die "not inside a Slurm job (SLURM_JOB_ID is not set): submit with 'sbatch jobs/$me${1:+ $1}'"
    check_slurm_env
}

# require_array_job WHAT: exits 2 unless an array task (WHAT: what the lines are).
require_array_job() {
    [ -n "${SLURM_ARRAY_TASK_ID+set}" ] ||
        die "not an array job (SLURM_ARRAY_TASK_ID is not set): submit with sbatch --array=0-N (N+1 = number of $1 lines)"
}

# read_lines FILE: FILE's lines into the array `lines`, without blank lines and
# lines starting with '#' (a final line without newline counts; CRs dropped).
read_lines() {
    local line
    lines=()
    while IFS= read -r line || [ -n "$line" ]; do
        line=${line%$'\r'}
        [[ $line =~ ^[[:space:]]*(#|$) ]] && continue
        lines+=("$line")
    done <"$1"
}

# Checkpoint names, by the one rule of docs/files.md §4 that the binary
# (store.c) and momfmm.files apply: exactly ckpt_ + the step's decimal digits
# zero-padded to 8 (no zero before a 9th digit, at most 2^63 - 1) + .h5.
# Ordered by step as a number, never as text (ckpt_100000000.h5 is newer than
# ckpt_99999999.h5), and no other spelling (ckpt_600.h5, ckpt_1e3.h5) counts.

STEP_MAX=9223372036854775807 # 2^63 - 1, compared as text at 19 digits

# is_checkpoint_name NAME: status 0 when NAME is a checkpoint's name.
is_checkpoint_name() {
    local LC_ALL=C # [0-9] is ASCII digits only
    [[ $1 =~ ^ckpt_([0-9]{8,19})\.h5$ ]] || return 1
    local digits=${BASH_REMATCH[1]}
    [ ${#digits} -eq 8 ] || [ "${digits:0:1}" != 0 ] || return 1
    # shellcheck disable=SC2071 # as text on purpose: 19 digits overflow the shell's arithmetic
    [ ${#digits} -lt 19 ] || [[ ! $digits > "$STEP_MAX" ]]
}

# newest_checkpoint DIR: the name of DIR's checkpoint with the highest step;
# empty (status 1) when DIR has none. Longer digits are a higher step, equal
# lengths compare as text, so no step overflows the shell's arithmetic.
newest_checkpoint() {
    local path name best=
    for path in "$1"/ckpt_*.h5; do
        name=${path##*/}
        is_checkpoint_name "$name" || continue
        if [ -z "$best" ] || [ ${#name} -gt ${#best} ] || { [ ${#name} -eq ${#best} ] && [[ $name > $best ]]; }; then
            best=$name
        fi
    done
    [ -n "$best" ] && echo "$best"
}

# checkpoint_name STEP: the name of step STEP's checkpoint; STEP is decimal
# digits as the binary reads them (leading zeros are not octal), else exit 2.
checkpoint_name() {
    [[ $1 =~ ^0*([0-9]+)$ ]] || die "a step must be decimal digits, got '$1'"
    local digits=${BASH_REMATCH[1]}
    # shellcheck disable=SC2071 # as text on purpose, as in is_checkpoint_name
    if [ ${#digits} -gt 19 ] || { [ ${#digits} -eq 19 ] && [[ $digits > "$STEP_MAX" ]]; }; then
        die "step $1 is above 2^63 - 1"
    fi
    while [ ${#digits} -lt 8 ]; do digits=0$digits; done
    echo "ckpt_$digits.h5"
}

# ini_steps INI: train.steps of an INI file (its [train] section), empty if absent.
ini_steps() {
    awk '/^[[:space:]]*\[/{s=$0; gsub(/[][[:space:]]/, "", s)} s=="train" && /^[[:space:]]*steps[[:space:]]*=/ {
        sub(/^[^=]*=[[:space:]]*/, ""); sub(/[[:space:]]*([;#].*)?$/, "");
        if ($0 ~ /^".*"$/) $0 = substr($0, 2, length($0) - 2); v=$0} END{print v}' "$1"
}

# parse_options HINT [--set section.key=value | --resume PATH]...: the --set
# overrides into the array `overrides`, except train.out_dir=DIR, which goes to
# `out_dir_set`; --resume PATH into `resume`. Anything else exits 2 (HINT
# ends that message).
parse_options() {
    local hint=$1
    shift
    overrides=()
    out_dir_set=
    resume=
    while [ $# -gt 0 ]; do
        case $1 in
        --set)
            [ $# -ge 2 ] || die "--set needs section.key=value"
            case $2 in
            train.out_dir=*) out_dir_set=${2#train.out_dir=} ;;
            *) overrides+=(--set "$2") ;;
            esac
            shift 2 ;;
        --resume)
            [ $# -ge 2 ] || die "--resume needs auto or a checkpoint path"
            resume=$2
            shift 2 ;;
        *) die "unexpected argument '$1' (expected --set section.key=value or --resume PATH$hint)" ;;
        esac
    done
}

# set_resume_arg OUT_DIR: `resume_arg` = auto, so that every start continues
# from the newest checkpoint, or the --resume PATH given (`resume`) while
# OUT_DIR has no checkpoint yet (e.g. to fine-tune).
set_resume_arg() {
    resume_arg=auto
    if [ -n "$resume" ] && [ "$resume" != auto ] && ! newest_checkpoint "$1" >/dev/null; then
        resume_arg=$resume
    fi
}

# find_binary: the momfmm binary into `bin`: $MOMFMM (relative to the submit
# directory), else build/momfmm there (a source tree), else momfmm on PATH (an
# installed one); exits 2 if there is none.
find_binary() {
    local base=${SLURM_SUBMIT_DIR:-$PWD}
    if [ -n "${MOMFMM:-}" ]; then
        bin=$MOMFMM
        case $bin in /*) ;; *) bin=$base/$bin ;; esac
    elif [ -x "$base/build/momfmm" ]; then
        bin=$base/build/momfmm
    else
        bin=$(command -v momfmm) || bin=
    fi
    [ -n "$bin" ] && [ -x "$bin" ] ||
        die "momfmm binary ${bin:-momfmm} not found: set MOMFMM, build build/momfmm (cmake --build build) or put an installed momfmm on PATH"
}

# find_wrapper: the launcher tools/momfmm-mpirun into `wrapper`: beside this
# file's jobs/ directory (a source tree, or DIR/share/momfmm of an
# installation, which holds tools/ and jobs/ alike), else momfmm-mpirun on
# PATH; exits 2 if there is none.
find_wrapper() {
    wrapper=$(cd "$MOMFMM_JOBS_DIR/../tools" 2>/dev/null && pwd)/momfmm-mpirun
    if [ ! -x "$wrapper" ]; then
        wrapper=$(command -v momfmm-mpirun) ||
            die "momfmm-mpirun not found: neither $MOMFMM_JOBS_DIR/../tools/momfmm-mpirun nor on PATH"
    fi
}

# set_launcher mpirun|srun: ranks x threads of this start (one rank per task,
# cpus-per-task threads per rank; `ranks` = slurm_ranks) and the launcher
# command into the array `launch`.
set_launcher() {
    local flags
    export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
    export OPENBLAS_NUM_THREADS=$OMP_NUM_THREADS
    # More ranks than CPUs (sbatch --overcommit): Open MPI would think each rank
    # has a core and spin while it waits; make waiting ranks yield the CPU.
    if [ "${SLURM_OVERCOMMIT:-0}" = 1 ]; then
        export OMPI_MCA_mpi_yield_when_idle=${OMPI_MCA_mpi_yield_when_idle:-1}
    fi
    ranks=$(slurm_ranks) # mpirun starts as many: it reads SLURM_TASKS_PER_NODE
    case $1 in
    mpirun)
        if [ -n "${MPIRUN_FLAGS+set}" ]; then
            read -r -a flags <<<"$MPIRUN_FLAGS"
        elif [ "$OMP_NUM_THREADS" -gt 1 ]; then
            flags=(--map-by "slot:PE=$OMP_NUM_THREADS" --bind-to core) # one core per thread
        else
            flags=()
        fi
        # a TERM to every process (plain scancel, time limit): mpirun's kill
        # sequence (SIGTERM, then SIGKILL) gives the ranks this long per stage
        # to write the checkpoint of their last finished step (docs/cli.md §5)
        export OMPI_MCA_odls_base_sigkill_timeout=${OMPI_MCA_odls_base_sigkill_timeout:-5}
        # mpirun ($MOMFMM_MPIRUN) through the one launcher of momfmm-mpirun:
        # stop requests, faults ended in bounded time (MOMFMM_LAUNCHER_GRACE),
        # the ranks' status (docs/cli.md §5)
        find_wrapper
        launch=("$wrapper" "${flags[@]}" -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS) ;;
    srun)
        # Since Slurm 22.05 srun does not take --cpus-per-task from the allocation by itself.
        export SRUN_CPUS_PER_TASK=${SLURM_CPUS_PER_TASK:-1}
        read -r -a flags <<<"${SRUN_FLAGS:-}"
        # --ntasks: the job's current task count; without it srun would start
        # SLURM_NTASKS tasks, the submitted count even after NumTasks was changed.
        [[ $ranks =~ ^[0-9]+$ ]] && flags=(--ntasks="$ranks" "${flags[@]}")
        launch=(srun --mpi=pmix --kill-on-bad-exit=1 "${flags[@]}") ;;
    *) die "MOMFMM_LAUNCHER=$1: expected mpirun or srun" ;;
    esac
}

# log_start OUT_DIR WHAT [LINE ...]: says what starts (WHAT, nodes, ranks x
# threads, run directory), each LINE, which library the script read (`lib`)
# and the command ("${launch[@]}" "${cmd[@]}"); appends one line to
# OUT_DIR/slurm_jobs.log.
log_start() {
    local out=$1 what=$2 line
    shift 2
    echo "$me: $what on ${SLURM_JOB_NODELIST:-?}: $ranks ranks x $OMP_NUM_THREADS threads, run dir $out"
    for line in "$@"; do echo "$me: $line"; done
    echo "$me: functions from ${lib:-?}"
    echo "$me: ${launch[*]} ${cmd[*]}"
    printf '%s job %s restart %s nodes %s ranks %s threads %s: %s\n' "$(date '+%Y-%m-%dT%H:%M:%S')" "$SLURM_JOB_ID" \
        "${SLURM_RESTART_COUNT:-0}" "${SLURM_JOB_NODELIST:-?}" "$ranks" "$OMP_NUM_THREADS" \
        "${launch[*]} ${cmd[*]}" >>"$out/slurm_jobs.log"
}

# run_step OUT_DIR LOG GROUP COMMAND...: runs COMMAND in the background, its
# output appended to LOG (none: LOG empty), in a process group of its own if
# GROUP is 1, and waits for it; sets `rc` to its exit status. (The job
# scripts' COMMAND is tools/momfmm-mpirun, which ends mpirun in bounded time
# once its ranks on this host have exited.) The caller's
# traps set `caught` and send SIGUSR1 to `step_pid` (docs/cli.md §5: momfmm
# checkpoints the last finished step, writes OUT_DIR/STOPPED and exits 0). A
# launcher drops a signal that comes before it has started the ranks (mpirun
# of Open MPI 4.1.4 in its first ~50 ms): until momfmm acknowledges the stop
# (STOPPED), the signal is sent again every 2 s.
run_step() {
    local out=$1 log=$2 group=$3 r
    shift 3
    rm -f "$out/STOPPED" # written by momfmm when a signal stop has checkpointed
    [ "$group" = 1 ] && set -m
    if [ -n "$log" ]; then
        "$@" >>"$log" 2>&1 </dev/null &
    else
        "$@" &
    fi
    step_pid=$!
    set +m
    [ -n "$caught" ] && kill -USR1 "$step_pid" 2>/dev/null
    # wait returns early whenever a trapped signal arrives: wait until the step is gone
    wait "$step_pid"
    rc=$?
    while kill -0 "$step_pid" 2>/dev/null; do
        if [ -n "$caught" ] && [ ! -f "$out/STOPPED" ]; then
            sleep 2
            kill -USR1 "$step_pid" 2>/dev/null
        else
            wait "$step_pid"
            rc=$?
        fi
    done
    wait "$step_pid" 2>/dev/null
    r=$?
    [ "$r" -ne 127 ] && rc=$r
    step_pid=
}

# forward SIG: the job scripts' trap: USR1 (time limit or preemption), TERM (scancel).
forward() {
    caught=$1
    echo "$me: got SIG$1 at $(date '+%H:%M:%S'): asking momfmm to checkpoint and stop"
    [ -n "$step_pid" ] && kill -USR1 "$step_pid" 2>/dev/null
}

# job_step OUT_DIR [LOG]: runs "${launch[@]}" "${cmd[@]}" (output appended to
# LOG if given) in the background, so that USR1 and TERM reach this shell and
# are forwarded as a stop request; sets `caught` and `rc`, 0 for a signal stop
# that wrote its checkpoint whatever the launcher's status (docs/cli.md §5:
# mpirun of Open MPI 4.1.4 exits 1 after forwarding SIGTERM).
job_step() {
    local out=$1 log=${2:-}
    caught=
    step_pid=
    trap 'forward USR1' USR1
    trap 'forward TERM' TERM
    run_step "$out" "$log" 0 "${launch[@]}" "${cmd[@]}"
    if [ "$rc" -ne 0 ] && [ -f "$out/STOPPED" ]; then
        echo "$me: momfmm stopped on a signal with a checkpoint ($(head -n 1 "$out/STOPPED")); launcher status $rc, reporting 0"
        rc=0
    fi
    echo "$me: momfmm exited with $rc at $(date '+%H:%M:%S')${log:+ (log: $log)}"
    if [ -n "$log" ] && [ "$rc" -ne 0 ]; then tail -n 5 "$log" >&2; fi
}

# requeue_if_stopped OUT_DIR WHAT [ONLY_IF_OK]: after a USR1 (time limit,
# preemption) requeues this job, which resumes from its newest checkpoint in
# OUT_DIR, unless MOMFMM_REQUEUE=0 (WHAT: e.g. "task 3", for the message).
# Checkpoints are written under a temporary name and renamed, so even a step
# that did not stop cleanly (USR1 during momfmm's start-up kills it) leaves the
# newest complete checkpoint to resume from: it is requeued anyway with a
# warning, unless ONLY_IF_OK is 1.
requeue_if_stopped() {
    [ "$caught" = USR1 ] && [ "${MOMFMM_REQUEUE:-1}" != 0 ] || return 0
    if [ "$rc" -ne 0 ]; then
        [ "${3:-0}" = 1 ] && return 0
        echo "$me: warning: momfmm exited with $rc after USR1; requeueing anyway" >&2
    fi
    echo "$me: requeueing job $SLURM_JOB_ID${2:+ ($2)}; it resumes from the newest checkpoint in $1"
    scontrol requeue "$SLURM_JOB_ID" || echo "$me: scontrol requeue $SLURM_JOB_ID failed" >&2
}

# train_job LAUNCHER CONFIG [--set section.key=value ...] [--resume PATH]: all
# of train.sbatch (LAUNCHER mpirun, or MOMFMM_LAUNCHER) and train_srun.sbatch
# (srun). Run directory MOMFMM_RUNS/<job name>-<job id> (default MOMFMM_RUNS=runs),
# unless --set train.out_dir=DIR; exits with momfmm's status.
train_job() {
    local launcher=$1
    shift
    require_job "CONFIG.ini [--set ...]"
    [ $# -ge 1 ] || die "usage: sbatch jobs/$me CONFIG.ini [--set section.key=value ...] [--resume PATH]"
    config=$1
    shift
    [ -r "$config" ] || die "config $config: not readable from $(pwd)"
    parse_options "" "$@"
    [ -n "$out_dir_set" ] || need_slurm SLURM_JOB_NAME "the run directory is MOMFMM_RUNS/<job name>-<job id>"
    out_dir=${out_dir_set:-${MOMFMM_RUNS:-runs}/${SLURM_JOB_NAME}-${SLURM_JOB_ID}}
    mkdir -p "$out_dir" || die "cannot create run directory $out_dir"
    set_resume_arg "$out_dir"
    find_binary
    set_launcher "$launcher"
    cmd=("$bin" train "$config" "${overrides[@]}" --set "train.out_dir=$out_dir" --resume "$resume_arg")
    log_start "$out_dir" "job $SLURM_JOB_ID (start $((${SLURM_RESTART_COUNT:-0} + 1)))"
    job_step "$out_dir"
    requeue_if_stopped "$out_dir" ""
    exit "$rc"
}
