"""Process helpers for the end-to-end tests that start long runs under mpirun:
find the rank processes, and kill a whole session so that no rank outlives a
test, even one that failed."""
import os
import signal


def _process_stats():
    """(pid, fields of /proc/<pid>/stat after the command name) of every
    process; fields[0] is the state, [1] the parent, [3] the session."""
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        yield int(p), stat[stat.rfind(")") + 2:].split()


def children(pid):
    """(pid, executable path) of the processes whose parent is pid. The ranks
    show up as `exe` in /proc/<pid>/comm (momfmm re-executes itself through
    /proc/self/exe to pick the OpenBLAS core), so match the executable."""
    out = []
    for p, fields in _process_stats():
        if int(fields[1]) == pid:
            try:
                out.append((p, os.path.realpath(f"/proc/{p}/exe")))
            except OSError:
                pass
    return out


def session_members(sid):
    """Live (not zombie) processes whose session id is sid."""
    return [p for p, fields in _process_stats() if int(fields[3]) == sid and fields[0] != "Z"]


def rank_of(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(b"OMPI_COMM_WORLD_RANK="):
                    return int(item.split(b"=", 1)[1])
    except OSError:
        pass
    return None


def kill_session(sid):
    for pid in session_members(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
