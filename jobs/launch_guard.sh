#!/bin/bash
# Runs a launcher and ends it in bounded time once its ranks on this host have
# exited (docs/design.md §8.11): for plain mpirun across hosts, where mpirun
# would otherwise wait forever for the daemon of a host that stopped answering.
#
#   jobs/launch_guard.sh mpirun [OPTIONS] momfmm train CONFIG ...
#
# MOMFMM_LAUNCHER_GRACE (default 30 s): how long the launcher may outlive its
# last local rank before SIGTERM (SIGKILL 10 s later). Exits with the
# launcher's status; SIGTERM and SIGINT are passed on to it. The job scripts do
# the same (run_step of momfmm_lib.sh beside this script, which holds the code).
set -u
me=launch_guard.sh
[ $# -ge 1 ] || { echo "usage: $0 LAUNCHER [ARGS...]" >&2; exit 2; }
# shellcheck source-path=SCRIPTDIR source=momfmm_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/momfmm_lib.sh" || exit 2
"$@" &
launcher=$!
trap 'kill -TERM $launcher 2>/dev/null' TERM INT
guard_launcher "$launcher" &
guard=$!
rc=0
# wait returns early when a trapped signal comes: until the launcher is gone
while kill -0 "$launcher" 2>/dev/null; do
    wait "$launcher"
    rc=$?
done
kill "$guard" 2>/dev/null
wait "$guard" 2>/dev/null
exit "$rc"
