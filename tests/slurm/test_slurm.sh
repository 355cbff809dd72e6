#!/usr/bin/env bash
# End-to-end test of the Slurm job scripts in jobs/ on a one-node Slurm cluster
# that this test brings up on this machine (munged, slurmctld and slurmd from
# Debian's packages, every file in temporary directories) and stops again.
#
#   tests/slurm/test_slurm.sh [--momfmm PATH] [--workdir DIR]
#
# Checks: train.sbatch (mpirun, 8 tasks) and train_srun.sbatch (srun --mpi=pmix,
# 4 tasks) train and checkpoint; a 3-task sweep.sbatch array writes 3 run
# directories and collect_sweep.sh reports them; jobs sent USR1 (one per
# launcher) checkpoint, requeue themselves, resume and end with the same
# weights, optimizer state and metric history, bit for bit, as an
# uninterrupted run (h5check.py beside this script); a requeued finished job does
# not train again; a train.sbatch and a train_srun.sbatch job at 4 tasks with
# dist.zero=1, sent USR1 and, once requeued, held, set to NumTasks=3 and
# released, start again with 3 ranks, resume the 4-rank checkpoint and end
# within 1e-5 of an uninterrupted run; the four job scripts source
# jobs/momfmm_lib.sh with the same block, find it beside the submitted script
# (Slurm runs a spooled copy) or through MOMFMM_JOBS_LIB, and a copy without
# it exits 2 saying so.
#
# Needs root (the daemons run as SlurmUser=root) and the packages slurmctld,
# slurmd, slurm-client and munge (tools/install_deps.sh). Where they are
# missing or the cluster does not start, the test says why and exits 0 as
# skipped, unless CI=true, where that is a failure. Prints `N passed, M failed`;
# exit 0 only if every check passed. Daemons are stopped on every exit.
set -u
TEST_NAME=test_slurm
# shellcheck source=tests/slurm/slurm_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/slurm_common.sh"
slurm_parse_args "$@"
DEADLINE=$((SECONDS + ${SLURM_TEST_BUDGET:-480})) # CTest TIMEOUT is 600: stop and clean up before it
slurm_client() { "$@"; } # slurmctld listens on this host

# ---- can the cluster run here? ----
slurm_need_root "slurmctld and slurmd run as SlurmUser=root"
slurm_need_tools
slurm_make_dirs slurm

# ---- stop everything we started, on any exit ----
cleaned=
cleanup() {
    [ -n "$cleaned" ] && return
    cleaned=1
    if [ -f "$D/run/slurmctld.pid" ]; then
        scancel --full --quiet --user=root 2>/dev/null
        for _ in $(seq 40); do
            [ -z "$(squeue -h -o %i 2>/dev/null)" ] && [ -z "$(scontrol listpids 2>/dev/null | tail -n +2)" ] && break
            sleep 0.5
        done
    fi
    stop_pid "$D/run/slurmd.pid" slurmd
    stop_pid "$D/run/slurmctld.pid" slurmctld
    stop_pid "$D/munge/munged.pid" munged
    slurm_cleanup_files
}
trap cleanup EXIT
trap 'echo "interrupted"; exit 1' INT TERM HUP

# ---- bring the cluster up ----
H=$(hostname -s)
NCPU=$(getconf _NPROCESSORS_ONLN) # not nproc: it follows OMP_NUM_THREADS
read -r CTLD_PORT SLURMD_PORT < <("$PY" -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
if command -v mungekey >/dev/null 2>&1; then
    mungekey --create --keyfile="$D/munge/munge.key" 2>"$D/log/mungekey.log"
else
    dd if=/dev/urandom of="$D/munge/munge.key" bs=1024 count=1 status=none
fi
chmod 600 "$D/munge/munge.key"
cat >"$CONF" <<EOF
# Written by tests/slurm/test_slurm.sh: a one-node cluster in $D
ClusterName=momfmmtest
SlurmctldHost=$H(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire also holds a requeued job before it starts again (default 120 s)
AuthInfo=socket=$D/munge/munge.socket,cred_expire=10
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
MpiDefault=none
ReturnToService=2
JobRequeue=1
MinJobAge=600
KillWait=15
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
NodeName=$H NodeAddr=127.0.0.1 NodeHostname=$H CPUs=$NCPU State=UNKNOWN
PartitionName=test Nodes=$H Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
munged --force --socket="$D/munge/munge.socket" --key-file="$D/munge/munge.key" --pid-file="$D/munge/munged.pid" \
    --log-file="$D/log/munged.log" --seed-file="$D/munge/munged.seed" >"$D/log/munged.out" 2>&1 ||
    skip "munged did not start: $(tail -n 3 "$D/log/munged.out" "$D/log/munged.log" 2>/dev/null | tr '\n' ' ')"
slurmctld -i >"$D/log/slurmctld.out" 2>&1 || skip "slurmctld did not start: $(tail -n 3 "$D/log/slurmctld.out" "$D/log/slurmctld.log" 2>/dev/null | tr '\n' ' ')"
slurmd -N "$H" >"$D/log/slurmd.out" 2>&1 || skip "slurmd did not start: $(tail -n 3 "$D/log/slurmd.out" "$D/log/slurmd.log" 2>/dev/null | tr '\n' ' ')"
state=
for _ in $(seq 60); do
    state=$(sinfo -h -n "$H" -o %T 2>/dev/null)
    [ "$state" = idle ] && break
    sleep 0.5
done
[ "$state" = idle ] || skip "node $H did not come up (state '${state}'): $(tail -n 3 "$D/log/slurmd.log" "$D/log/slurmctld.log" 2>/dev/null | tr '\n' ' ')"
note "cluster up: node $H, $NCPU CPUs, ports $CTLD_PORT/$SLURMD_PORT, state in $D, jobs in $WORK"

# ---- helpers (job_field, wait_for, job_ok, show_log, h5: slurm_common.sh) ----
# Waits until every job (or array task) of the ids is in a final state.
wait_jobs() { # timeout_s id...
    local until=$((SECONDS + $1)) id states
    shift
    [ "$until" -gt "$DEADLINE" ] && until=$DEADLINE
    while [ "$SECONDS" -lt "$until" ]; do
        states=$(for id in "$@"; do scontrol -o show job "$id" 2>/dev/null | grep -oP 'JobState=\K\S+' || echo UNKNOWN; done)
        echo "$states" | grep -qvE '^(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED)$' || return 0
        sleep 1
    done
    echo "  .. timed out waiting for jobs $*: $(echo $states)"
    return 1
}
cd "$WORK" || exit 1
# Tiny chain-task model: 30 steps, a train-log row every 5 steps.
cat >tiny.ini <<'EOF'
[model]
vocab_size = 32
d_model = 32
n_heads = 4
n_layers = 2
d_ff = 64

[momentum]
gamma = 0.1

[data]
task = chain
seq_len = 16
chain_len = 5

[train]
steps = 30
batch_size = 8
lr = 3e-3
warmup = 2
log_interval = 5
eval_interval = 15
eval_batches = 1
EOF
# Longer run for the preemption check: 300 steps, several seconds on 4 ranks.
cat >long.ini <<'EOF'
[model]
vocab_size = 32
d_model = 64
n_heads = 4
n_layers = 2
d_ff = 128

[momentum]
gamma = 0.1

[data]
task = chain
seq_len = 64
chain_len = 8

[train]
; bitwise against a separate uninterrupted run: one engine for both, as
; auto's measurement may choose differently in each (docs/design.md §8.10)
gemm = openblas
steps = 300
batch_size = 16
lr = 3e-3
warmup = 10
log_interval = 10
eval_interval = 100
eval_batches = 1
EOF
# Requeue onto fewer tasks (dist.zero = 1, 4 tasks, then 3): 100 steps, a
# checkpoint every 20. adam_eps 1e-6 as in e2e_scale_resume: with 1e-8, Adam
# turns the rounding noise of zero gradients (the key bias) into lr-sized steps.
# long.ini's model and data with its own [train] section
sed '/^\[train\]/,$d' long.ini >fewer.ini
cat >>fewer.ini <<'EOF'
[train]
steps = 100
batch_size = 32
lr = 3e-3
warmup = 10
adam_eps = 1e-6
log_interval = 5
eval_interval = 50
eval_batches = 1
ckpt_interval = 20
keep = 10
EOF
printf '%s\n' '# test sweep' '--set momentum.gamma=0' '' '--set momentum.gamma=0.2' \
    '--set attention.kind=fmm --set momentum.gamma=0.1' >sweep.txt
mkdir -p runs/slurm # the job files' #SBATCH --output=runs/slurm/...

# ---- 0. the job scripts are thin over jobs/momfmm_lib.sh ----
# Each finds the library with the same block and keeps no copy of its functions.
lib_block() { sed -n '/^# ---- the shared functions/,/^}$/p' "$ROOT/jobs/$1.sbatch"; }
sums=$(for f in train train_srun sweep experiments; do lib_block "$f" | md5sum | cut -c1-8; done | tr '\n' ' ')
copies=$(grep -lE '^(die|slurm_ranks|set_launcher|find_binary|run_step|job_step|forward)\(\)' "$ROOT"/jobs/*.sbatch)
if [ "$(echo "$sums" | tr ' ' '\n' | grep -c .)" = 4 ] && [ "$(echo "$sums" | tr ' ' '\n' | sort -u | grep -c .)" = 1 ] &&
    lib_block train | grep -q 'momfmm_lib.sh' && [ -z "$copies" ]; then
    pass "job scripts source jobs/momfmm_lib.sh" "the same block in all 4 (md5 $sums), no copied functions"
else
    fail "job scripts source jobs/momfmm_lib.sh" "md5 of the block in train, train_srun, sweep, experiments: $sums; functions copied in: ${copies:-none}"
fi

# ---- 1. train.sbatch (mpirun, 8 ranks), train_srun.sbatch (srun, 4), a sweep of 3, all queued at once ----
J_MPI=$(sbatch --parsable --nodes=1 --ntasks=8 --overcommit --time=5 "$ROOT/jobs/train.sbatch" tiny.ini 2>&1)
J_SRUN=$(sbatch --parsable --nodes=1 --ntasks=4 --overcommit --time=5 "$ROOT/jobs/train_srun.sbatch" tiny.ini \
    --set train.out_dir=runs/srun_run 2>&1)
J_SWEEP=$(sbatch --parsable --array=0-2%2 --nodes=1 --ntasks=2 --overcommit --time=5 "$ROOT/jobs/sweep.sbatch" \
    tiny.ini sweep.txt --set train.steps=20 2>&1)
# A copy of train.sbatch with no momfmm_lib.sh beside it nor in jobs/ of the
# submit directory: refused with a message; given MOMFMM_JOBS_LIB, it trains.
cp "$ROOT/jobs/train.sbatch" nolib.sbatch
J_NOLIB=$(sbatch --parsable --job-name=nolib --nodes=1 --ntasks=1 --time=5 nolib.sbatch tiny.ini 2>&1)
J_LIBVAR=$(MOMFMM_JOBS_LIB=$ROOT/jobs/momfmm_lib.sh sbatch --parsable --job-name=libvar --nodes=1 --ntasks=2 \
    --overcommit --time=5 nolib.sbatch tiny.ini --set train.steps=10 2>&1)
for j in "$J_MPI" "$J_SRUN" "$J_SWEEP" "$J_NOLIB" "$J_LIBVAR"; do
    [[ $j =~ ^[0-9]+$ ]] || { fail "sbatch" "submission failed: $j"; echo "$passed passed, $failed failed"; exit 1; }
done
note "submitted train.sbatch $J_MPI, train_srun.sbatch $J_SRUN, sweep.sbatch $J_SWEEP, copies $J_NOLIB $J_LIBVAR"
wait_jobs 150 "$J_MPI" "$J_SRUN" "$J_SWEEP" "$J_NOLIB" "$J_LIBVAR"
note "first batch done"

# train.sbatch: per-job run dir, %x-%j.out, 8 ranks; the library found beside
# the submitted script (the job runs a spooled copy, submitted from $WORK)
if job_ok "train.sbatch (mpirun, 8 tasks) completes" "$J_MPI"; then
    d=runs/momfmm-$J_MPI
    if r=$(h5 ckpt "$d" 30 8 6); then pass "train.sbatch checkpoint" "$d/$r"; else fail "train.sbatch checkpoint" "$d: $r"; show_log "runs/slurm/momfmm-$J_MPI.out"; fi
    [ -f "runs/slurm/momfmm-$J_MPI.out" ] && grep -q "^step 30/30" "runs/slurm/momfmm-$J_MPI.out" &&
        pass "train.sbatch output file" "runs/slurm/momfmm-$J_MPI.out (%x-%j.out) has the training log" ||
        fail "train.sbatch output file" "runs/slurm/momfmm-$J_MPI.out missing or without 'step 30/30'"
    grep -qx "train.sbatch: functions from $ROOT/jobs/momfmm_lib.sh" "runs/slurm/momfmm-$J_MPI.out" &&
        pass "train.sbatch library" "read $ROOT/jobs/momfmm_lib.sh, beside the submitted script" ||
        fail "train.sbatch library" "$(grep -m1 'functions from' "runs/slurm/momfmm-$J_MPI.out")"
else
    show_log "runs/slurm/momfmm-$J_MPI.out"
fi
# train_srun.sbatch: --set train.out_dir wins, 4 ranks
if job_ok "train_srun.sbatch (srun --mpi=pmix, 4 tasks) completes" "$J_SRUN"; then
    if r=$(h5 ckpt runs/srun_run 30 4 6); then pass "train_srun.sbatch checkpoint (--set train.out_dir wins)" "runs/srun_run/$r"
    else fail "train_srun.sbatch checkpoint" "runs/srun_run: $r"; show_log "runs/slurm/momfmm-$J_SRUN.out"; fi
else
    show_log "runs/slurm/momfmm-$J_SRUN.out"
fi
# sweep: 3 run dirs with the right overrides, one report
if job_ok "sweep.sbatch array 0-2%2 completes" "$J_SWEEP"; then
    ok=1
    msg=
    for t in 0 1 2; do
        d=runs/momfmm-sweep-${J_SWEEP}_$t
        r=$(h5 ckpt "$d" 20 2 4) || { ok=; msg+="$d: $r; "; }
    done
    h5 config "runs/momfmm-sweep-${J_SWEEP}_1" '^\s*gamma\s*=\s*0\.2' || { ok=; msg+="task 1 config has no gamma = 0.2; "; }
    h5 config "runs/momfmm-sweep-${J_SWEEP}_2" '^\s*kind\s*=\s*fmm' || { ok=; msg+="task 2 config has no kind = fmm; "; }
    [ -n "$ok" ] && pass "sweep run directories" "runs/momfmm-sweep-${J_SWEEP}_{0,1,2} at step 20 with their overrides" ||
        fail "sweep run directories" "$msg"
    [ -z "$ok" ] && for t in 0 1 2; do show_log "runs/slurm/momfmm-sweep-${J_SWEEP}_$t.out"; done
fi
# the copy without the library: exit 2 naming it; with MOMFMM_JOBS_LIB: trained
nolib_state=$(scontrol -o show job "$J_NOLIB" 2>/dev/null | grep -oP '\b(JobState|ExitCode)=\S+' | tr '\n' ' ')
if [[ $nolib_state == "JobState=FAILED ExitCode=2:0 " ]] &&
    grep -q "cannot read .*momfmm_lib.sh.*MOMFMM_JOBS_LIB" "runs/slurm/nolib-$J_NOLIB.out"; then
    pass "job script without its library" "exit 2: $(grep -m1 'cannot read' "runs/slurm/nolib-$J_NOLIB.out")"
else
    fail "job script without its library" "$nolib_state"
    show_log "runs/slurm/nolib-$J_NOLIB.out"
fi
if job_ok "job script with MOMFMM_JOBS_LIB completes" "$J_LIBVAR"; then
    if r=$(h5 ckpt "runs/libvar-$J_LIBVAR" 10 2 2) &&
        grep -qx "train.sbatch: functions from $ROOT/jobs/momfmm_lib.sh" "runs/slurm/libvar-$J_LIBVAR.out"; then
        pass "job script with MOMFMM_JOBS_LIB" "read the library it names; $r"
    else
        fail "job script with MOMFMM_JOBS_LIB" "$r"
        show_log "runs/slurm/libvar-$J_LIBVAR.out"
    fi
else
    show_log "runs/slurm/libvar-$J_LIBVAR.out"
fi

report=$("$ROOT/jobs/collect_sweep.sh" -o sweep_report.md "$J_SWEEP" 2>&1)
rc=$?
if [ ! -f "$ROOT/tools/momfmm_report.py" ]; then
    [ $rc -eq 3 ] && echo "$report" | grep -q "momfmm_report.py not found" &&
        pass "collect_sweep.sh" "tools/momfmm_report.py is missing and the helper says so (exit 3)" ||
        fail "collect_sweep.sh" "without tools/momfmm_report.py: exit $rc: $report"
else
    rows=0
    for t in 0 1 2; do
        [ "$(grep -c "^|.*momfmm-sweep-${J_SWEEP}_$t\b" sweep_report.md 2>/dev/null)" -ge 2 ] && rows=$((rows + 1))
    done
    if [ $rc -eq 0 ] && [ $rows -eq 3 ]; then
        pass "collect_sweep.sh report" "sweep_report.md: task table and momfmm_report.py rows for all 3 runs"
    else
        fail "collect_sweep.sh report" "exit $rc, $rows of 3 runs in both tables: $(echo "$report" | tail -n 12)"
    fi
fi

# ---- 2. preemption: USR1 -> checkpoint -> requeue -> resume -> same weights ----
# One job per launcher (train.sbatch: mpirun; train_srun.sbatch: srun), 4 ranks
# each, both compared with one uninterrupted run of the same config.
# Every step at least SLOW_MS (the test hook MOMFMM_TEST_STEP_SLEEP_MS; the
# same floats), and each job signalled as soon as it is ready, not after the
# other: an srun job once ran all its steps while the test still waited for
# the mpirun job's, and was never stopped.
SLOW_MS=40
declare -A P_ID=()
for script in train train_srun; do
    j=$(sbatch --parsable --job-name="preempt-$script" --nodes=1 --ntasks=4 --overcommit --time=5 \
        --export="ALL,MOMFMM_TEST_STEP_SLEEP_MS=$SLOW_MS" "$ROOT/jobs/$script.sbatch" long.ini 2>&1)
    [[ $j =~ ^[0-9]+$ ]] || { fail "sbatch" "submission failed: $j"; echo "$passed passed, $failed failed"; exit 1; }
    P_ID[$script]=$j
done
note "submitted the preemption jobs ${P_ID[train]} (mpirun) and ${P_ID[train_srun]} (srun)"
# USR1 to each job of a section (ids in the array named $1, job names
# $2-train and $2-train_srun) as soon as `$3 OUT RUN_DIR` says it is ready,
# not after the other; true when both have had it (USR1_SENT[$2-script]).
declare -A USR1_SENT=()
usr1_when_ready() {
    local -n ids=$1
    local script j o left=
    for script in train train_srun; do
        [ -n "${USR1_SENT[$2-$script]:-}" ] && continue
        j=${ids[$script]}
        o=runs/slurm/$2-$script-$j.out
        if "$3" "$o" "runs/$2-$script-$j"; then
            scancel --signal=USR1 --batch "$j"
            USR1_SENT[$2-$script]=1
            note "sent USR1 to job $j after: $(grep -E '^step [0-9]+/' "$o" | tail -n 1 | cut -d'|' -f1)"
        else
            left=1
        fi
    done
    [ -z "$left" ]
}
logged_a_step() { grep -qsE '^step [0-9]+/300' "$1"; }
wait_for 90 usr1_when_ready P_ID preempt logged_a_step
for script in train train_srun; do
    [ -n "${USR1_SENT[preempt-$script]:-}" ] && continue
    j=${P_ID[$script]}
    fail "preemption job $script.sbatch" "job $j did not log a step: $(job_field "$j" JobState)"
    show_log "runs/slurm/preempt-$script-$j.out"
done
# A finished job that is requeued must not train again.
scontrol requeue "$J_MPI" 2>&1 | sed 's/^/  .. requeue: /'
mpi_ckpt=runs/momfmm-$J_MPI/ckpt_00000030.h5
mpi_sum=$(md5sum <"$mpi_ckpt" 2>/dev/null)
# While the preempted jobs wait in the queue, the uninterrupted reference run.
requeued() { [ "$(job_field "${P_ID[train]}" Restarts)" = 1 ] && [ "$(job_field "${P_ID[train_srun]}" Restarts)" = 1 ]; }
wait_for 60 requeued || note "jobs ${P_ID[*]} not both requeued yet"
note "reference run: $MPIEXEC -np 4 outside Slurm"
"$MPIEXEC" --oversubscribe -np 4 -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS "$MOMFMM_BIN" train long.ini \
    --set train.out_dir=runs/reference >reference.log 2>&1
ref_rc=$?
wait_jobs 150 "${P_ID[@]}" "$J_MPI"
note "preempted jobs and the requeued finished job done"

for script in train train_srun; do
    j=${P_ID[$script]}
    P_OUT=runs/slurm/preempt-$script-$j.out
    P_DIR=runs/preempt-$script-$j
    t="$script.sbatch preempted:"
    before=$failed
    job_ok "$t job completes" "$j" || { show_log "$P_OUT"; continue; }
    restarts=$(job_field "$j" Restarts)
    stop_line=$(grep -m1 '^stop requested' "$P_OUT")
    k=$(echo "$stop_line" | grep -oP 'step \K[0-9]+')
    ck=$(printf 'ckpt_%08d.h5' "${k:-0}")
    if [ -n "$k" ] && [ "$k" -gt 0 ] && [ "$k" -lt 300 ] && [ -f "$P_DIR/$ck" ]; then
        pass "$t USR1 -> checkpoint" "'$stop_line', $P_DIR/$ck kept"
    else
        fail "$t USR1 -> checkpoint" "no 'stop requested' line or no intermediate checkpoint (line '$stop_line'; $(ls "$P_DIR" 2>/dev/null | tr '\n' ' '))"
    fi
    if [ "$restarts" = 1 ] && grep -q "requeueing job $j" "$P_OUT" && [ "$(grep -c " job $j restart " "$P_DIR/slurm_jobs.log")" = 2 ]; then
        pass "$t requeued" "scontrol: Restarts=$restarts; two starts in $P_DIR/slurm_jobs.log"
    else
        fail "$t requeued" "Restarts=$restarts; $(grep -c . "$P_DIR/slurm_jobs.log" 2>/dev/null) starts logged"
    fi
    resumed=$(grep -m1 '^resumed from' "$P_OUT")
    if [ -n "$k" ] && echo "$resumed" | grep -q "$ck at step $k\$"; then pass "$t resumed" "'$resumed'"
    else fail "$t resumed" "expected 'resumed from $P_DIR/$ck at step $k', got '$resumed'"; fi
    if r=$(h5 ckpt "$P_DIR" 300 4 30); then pass "$t finished" "$r"; else fail "$t finished" "$r"; fi
    if [ $ref_rc -ne 0 ]; then
        fail "$t bit-exact resume" "reference run failed (exit $ref_rc): $(tail -n 3 reference.log)"
    elif r=$(h5 same "$P_DIR/ckpt_00000300.h5" runs/reference/ckpt_00000300.h5); then
        pass "$t bit-exact resume" "stopped at step $k, vs uninterrupted (4 ranks x 1 thread): $r"
    else
        fail "$t bit-exact resume" "stopped at step $k, vs uninterrupted: $r"
    fi
    [ $failed -gt "$before" ] && show_log "$P_OUT"
done

# the requeued finished job: started again, did nothing, left its checkpoint alone
if job_ok "requeued finished job completes" "$J_MPI"; then
    if [ "$(job_field "$J_MPI" Restarts)" = 1 ] && grep -q '^nothing to do' "runs/slurm/momfmm-$J_MPI.out" &&
        [ "$(md5sum <"$mpi_ckpt" 2>/dev/null)" = "$mpi_sum" ] && [ "$(ls runs/momfmm-$J_MPI/ckpt_*.h5 | wc -l)" = 1 ]; then
        pass "finished job does not run again" "restart 1 logged 'nothing to do'; ckpt_00000030.h5 unchanged"
    else
        fail "finished job does not run again" "Restarts=$(job_field "$J_MPI" Restarts); $(grep -m1 'nothing to do' "runs/slurm/momfmm-$J_MPI.out")"
        show_log "runs/slurm/momfmm-$J_MPI.out"
    fi
fi

# ---- 3. requeued onto fewer tasks: dist.zero = 1 at 4 tasks, resumed at 3 ----
# The commands of docs/cluster.md §10.5: USR1, the script requeues the job; while it waits
# (cred_expire) hold it, set NumTasks=3, release it. One job per launcher, run
# side by side: mpirun starts 3 ranks (it reads SLURM_TASKS_PER_NODE), srun
# as many as train_srun.sbatch passes as --ntasks (its default, SLURM_NTASKS,
# still says 4); the 3 ranks resume the 4-rank checkpoint.
FEWER_TOL=1e-5 # e2e_scale_resume's tolerance for np 4 -> np 3
declare -A Z_ID=() Z_UPDATE=()
for script in train train_srun; do
    j=$(sbatch --parsable --job-name="fewer-$script" --nodes=1 --ntasks=4 --overcommit --time=5 \
        --export="ALL,MOMFMM_TEST_STEP_SLEEP_MS=$SLOW_MS" "$ROOT/jobs/$script.sbatch" fewer.ini --set dist.zero=1 2>&1)
    [[ $j =~ ^[0-9]+$ ]] || { fail "sbatch" "submission failed: $j"; echo "$passed passed, $failed failed"; exit 1; }
    Z_ID[$script]=$j
done
note "submitted jobs ${Z_ID[train]} (train.sbatch) and ${Z_ID[train_srun]} (train_srun.sbatch): 4 tasks, dist.zero=1"
at_step_40() { grep -qsE '^step 40/100' "$1" && [ -f "$2/ckpt_00000020.h5" ]; }
wait_for 90 usr1_when_ready Z_ID fewer at_step_40
for script in train train_srun; do
    j=${Z_ID[$script]}
    if [ -n "${USR1_SENT[fewer-$script]:-}" ]; then
        Z_UPDATE[$script]="not run (job not back in the queue)"
    else
        fail "$script.sbatch requeued onto fewer tasks: preemption" "job $j did not reach step 40 with ckpt_00000020.h5: $(job_field "$j" JobState)"
        show_log "runs/slurm/fewer-$script-$j.out"
    fi
done
# Each requeued job is held as soon as it is pending, before cred_expire (10 s) lets it start.
z_update() { # updates every preempted job that is back in the queue; true when none is left
    local script j u left=
    for script in "${!Z_UPDATE[@]}"; do
        [ "${Z_UPDATE[$script]}" = "not run (job not back in the queue)" ] || continue
        j=${Z_ID[$script]}
        if [ "$(job_field "$j" Restarts)" = 1 ] && [ "$(job_field "$j" JobState)" = PENDING ]; then
            u=$({ scontrol hold "$j" && scontrol update JobId="$j" NumTasks=3 && scontrol release "$j"; } 2>&1) &&
                u=ok || u="failed: $u"
            Z_UPDATE[$script]=$u
            note "requeued job $j: hold, NumTasks=3, release: $u"
        else
            left=1
        fi
    done
    [ -z "$left" ]
}
wait_for 60 z_update || note "not back in the queue: $(for s in "${!Z_UPDATE[@]}"; do j=${Z_ID[$s]}; echo "job $j $(job_field "$j" JobState) Restarts=$(job_field "$j" Restarts)"; done)"
# While the requeued jobs run, the uninterrupted reference at 4 ranks.
"$MPIEXEC" --oversubscribe -np 4 -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS "$MOMFMM_BIN" train fewer.ini \
    --set dist.zero=1 --set train.out_dir=runs/reference_fewer >reference_fewer.log 2>&1
zref_rc=$?
wait_jobs 120 "${Z_ID[@]}"
note "jobs ${Z_ID[*]} done"

for script in train train_srun; do
    j=${Z_ID[$script]}
    Z_OUT=runs/slurm/fewer-$script-$j.out
    Z_DIR=runs/fewer-$script-$j
    t="$script.sbatch requeued onto fewer tasks:"
    before=$failed
    if job_ok "$t job completes" "$j"; then
        # Slurm's record, what momfmm started with each time, what the script logged
        ranks=$(grep -oP '^momfmm: \K[0-9]+(?= ranks)' "$Z_OUT" | tr '\n' ' ')
        logged=$(grep -oP ' ranks \K[0-9]+' "$Z_DIR/slurm_jobs.log" 2>/dev/null | tr '\n' ' ')
        if [ "${Z_UPDATE[$script]:-}" = ok ] && [ "$(job_field "$j" NumTasks)" = 3 ] &&
            [ "$(job_field "$j" Restarts)" = 1 ] && [ "$ranks" = "4 3 " ] && [ "$logged" = "4 3 " ]; then
            pass "$t 4 ranks, then 3" "NumTasks=3 after requeue; momfmm start-up lines: $ranks; slurm_jobs.log: $logged"
        else
            fail "$t 4 ranks, then 3" "hold/update/release: ${Z_UPDATE[$script]:-not run}; NumTasks=$(job_field "$j" NumTasks), Restarts=$(job_field "$j" Restarts); momfmm started with '$ranks' ranks; slurm_jobs.log '$logged'"
        fi
        stop_line=$(grep -m1 '^stop requested' "$Z_OUT")
        k=$(echo "$stop_line" | grep -oP 'step \K[0-9]+')
        ck=$(printf 'ckpt_%08d.h5' "${k:-0}")
        resumed=$(grep -m1 '^resumed from' "$Z_OUT")
        w=$(h5 world "$Z_DIR/$ck" | tail -n 1)
        if [ -n "$k" ] && [ "$k" -ge 40 ] && [ "$k" -lt 100 ] && [ "$w" = "$k 4" ] &&
            echo "$resumed" | grep -q "$Z_DIR/$ck at step $k\$"; then
            pass "$t resumed the 4-rank checkpoint" "'$stop_line'; $ck has world_size 4; '$resumed'"
        else
            fail "$t resumed the 4-rank checkpoint" "'$stop_line'; $ck: step, world_size '$w'; '$resumed'"
        fi
        if r=$(h5 ckpt "$Z_DIR" 100 3 20); then pass "$t finished at 3 ranks" "$r"; else fail "$t finished at 3 ranks" "$r"; fi
        if [ $zref_rc -ne 0 ]; then
            fail "$t weights" "reference run failed (exit $zref_rc): $(tail -n 3 reference_fewer.log)"
        elif r=$(h5 close runs/reference_fewer/ckpt_00000100.h5 "$Z_DIR/ckpt_00000100.h5" "$FEWER_TOL"); then
            pass "$t weights within $FEWER_TOL" "vs uninterrupted (4 ranks, zero 1): $r"
        else
            fail "$t weights within $FEWER_TOL" "vs uninterrupted (4 ranks, zero 1): $r"
        fi
    fi
    [ $failed -gt "$before" ] && show_log "$Z_OUT"
done

note "done"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
