# shellcheck shell=bash
# What the Slurm tests share (sourced by test_slurm.sh, one node, and
# test_slurm_multinode.sh, the namespace test bed): arguments, the checks'
# tally, the skip rule, the preconditions, the state directories and the
# environment, stopping a daemon, and the job and checkpoint helpers.
# The sourcing script sets TEST_NAME (for SKIP lines) and DEADLINE, and
# defines slurm_client (how Slurm's clients reach slurmctld) before it calls
# the job helpers.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
MOMFMM_BIN=$ROOT/build/momfmm
WORK=
WORK_IS_TEMP=
PY=/usr/bin/python3
MPIEXEC=${MPIEXEC:-mpirun} # FindMPI's MPIEXEC_EXECUTABLE under CTest
START=$SECONDS
passed=0
failed=0

slurm_parse_args() { # "$@" of the test
    while [ $# -gt 0 ]; do
        case $1 in
        --momfmm) MOMFMM_BIN=$2; shift 2 ;;
        --workdir) WORK=$2; shift 2 ;;
        *) echo "usage: $0 [--momfmm PATH] [--workdir DIR]" >&2; exit 2 ;;
        esac
    done
}

pass() { passed=$((passed + 1)); echo "PASS $1${2:+: $2}"; }
fail() { failed=$((failed + 1)); echo "FAIL $1${2:+: $2}"; }
# Under CI=true a cluster that cannot run is a failure, not a skip.
skip() {
    if [ "${CI:-}" = true ]; then
        fail "slurm cluster" "$1 (CI=true: not skipping)"
        echo "$passed passed, $failed failed"
        exit 1
    fi
    skip_always "$1"
}
skip_always() {
    echo "SKIP $TEST_NAME: $1"
    exit 0
}
note() { echo "  .. $* ($((SECONDS - START)) s)"; }
give_up() { # name detail: a precondition that is this checkout's fault
    fail "$1" "$2"
    echo "$passed passed, $failed failed"
    exit 1
}

slurm_need_root() { [ "$(id -u)" -eq 0 ] || skip "needs root ($1)"; }

# The daemons, the clients, the launcher, the binary and the Python modules.
slurm_need_tools() {
    local c
    for c in munged slurmctld slurmd sbatch srun scontrol scancel squeue sinfo "$MPIEXEC"; do
        command -v "$c" >/dev/null 2>&1 ||
            skip "$c not found: install slurmctld slurmd slurm-client munge (tools/install_deps.sh)"
    done
    [ -x "$MOMFMM_BIN" ] || give_up "momfmm binary" "$MOMFMM_BIN not found: build it first"
    MOMFMM_BIN=$(cd "$(dirname "$MOMFMM_BIN")" && pwd)/$(basename "$MOMFMM_BIN")
    "$PY" -c "import h5py, numpy" 2>/dev/null || give_up "python" "$PY cannot import h5py and numpy"
}

# Job files (configs, runs, job output) in WORK; daemon state in D, a short
# /tmp path (unix socket paths are limited to 108 bytes); the environment of
# every job: this cluster's SLURM_CONF and nobody else's job.
slurm_make_dirs() { # suffix
    if [ -n "$WORK" ]; then
        rm -rf "$WORK" && mkdir -p "$WORK" || exit 1
        WORK=$(cd "$WORK" && pwd)
    else
        WORK=$(mktemp -d --suffix=".momfmm-$1-work")
        # shellcheck disable=SC2034 # read by the tests' cleanup
        WORK_IS_TEMP=1
    fi
    D=$(mktemp -d --suffix=".momfmm-$1")
    mkdir -p "$D"/{munge,state,spool,log,run}
    chmod 755 "$D" "$D/munge"
    CONF=$D/slurm.conf
    local v
    for v in $(compgen -e | grep '^SLURM_'); do unset "$v"; done
    export SLURM_CONF=$CONF
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
    export MOMFMM=$MOMFMM_BIN
    unset MOMFMM_RUNS MPIRUN_FLAGS SRUN_FLAGS MOMFMM_LAUNCHER MOMFMM_REQUEUE
}

stop_pid() { # pid file, name
    local pid
    pid=$(cat "$1" 2>/dev/null) || return 0
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
    echo "  .. $2 (pid $pid) ignored TERM: killing it"
    kill -KILL "$pid" 2>/dev/null
}

# The end of a test's cleanup, once its daemons are stopped: any process
# still running with this cluster's SLURM_CONF (job steps, slurmstepd) is
# ours and killed; the daemon logs go to WORK, which is kept unless it was
# a temporary directory and every check passed.
slurm_cleanup_files() {
    local p
    for p in /proc/[0-9]*; do
        p=${p#/proc/}
        [ "$p" = $$ ] && continue
        if tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qx "SLURM_CONF=$CONF"; then
            [ -d "/proc/$p" ] && echo "  .. killing leftover pid $p ($(tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | cut -c1-60))"
            kill -KILL "$p" 2>/dev/null
        fi
    done
    mkdir -p "$WORK/daemon_logs" && cp "$D"/log/*.log "$WORK/daemon_logs/" 2>/dev/null
    rm -rf "$D"
    if [ -n "${WORK_IS_TEMP:-}" ] && [ "$failed" -eq 0 ]; then
        rm -rf "$WORK"
    else
        echo "  .. job files and daemon logs kept in $WORK"
    fi
}

job_field() { # job id, field -> value (first line: the job or array task 0)
    slurm_client scontrol -o show job "$1" 2>/dev/null | head -n 1 | grep -oP "(^| )$2=\K\S+"
}
wait_for() { # timeout_s command... : polls every 0.2 s, never past DEADLINE
    local until=$((SECONDS + $1))
    shift
    [ "$until" -gt "$DEADLINE" ] && until=$DEADLINE
    while [ "$SECONDS" -lt "$until" ]; do "$@" && return 0; sleep 0.2; done
    return 1
}
job_ok() { # name id: COMPLETED with exit 0 (every array task)
    local lines
    lines=$(slurm_client scontrol -o show job "$2" 2>/dev/null)
    if [ -n "$lines" ] && ! echo "$lines" | grep -vE 'JobState=COMPLETED .*ExitCode=0:0' | grep -q .; then
        pass "$1" "job $2 COMPLETED, exit 0"
    else
        fail "$1" "job $2: $(echo "$lines" | grep -oP '(JobId|ArrayTaskId|JobState|ExitCode|Reason|NodeList)=\S+' | tr '\n' ' ')"
        return 1
    fi
}
show_log() { echo "  --- $1 (last 15 lines)"; tail -n 15 "$1" 2>/dev/null | sed 's/^/  | /'; }
# Checkpoint checks (ckpt, same, close, world, config): tests/slurm/h5check.py
h5() { PYTHONPATH="$ROOT/python:$ROOT/tests/e2e${PYTHONPATH:+:$PYTHONPATH}" "$PY" "$ROOT/tests/slurm/h5check.py" "$@" 2>&1; }
