"""The multi-host test bed (tests/multihost/netbed.sh, docs/design.md §8.11)
from Python: the bed's variables (NETBED_* set by `netbed.sh with`), mpirun
launched on host 1 across a chosen set of hosts, and the processes of one
host. The tests import these rather than build their own mpirun lines."""
import os
import subprocess


class Bed:
    def __init__(self):
        missing = [k for k in ("NETBED_PREFIX", "NETBED_HOSTS", "NETBED_DIR", "NETBED_SCRIPT") if k not in os.environ]
        assert not missing, ("run under `tests/multihost/netbed.sh with PREFIX N DIR -- pytest ...` "
                             f"(missing {missing})")
        self.prefix = os.environ["NETBED_PREFIX"]
        self.hosts = int(os.environ["NETBED_HOSTS"])
        self.dir = os.environ["NETBED_DIR"]
        self.subnet = os.environ["NETBED_SUBNET"]
        self.agent = os.environ["NETBED_AGENT"]
        self.script = os.environ["NETBED_SCRIPT"]

    def address(self, i):
        return f"10.77.0.{i}"

    def name(self, i):
        return f"{self.prefix}-h{i}"

    def hostfile(self, hosts, per_host):
        """A hostfile by address of hosts (1-based numbers) with per_host slots each."""
        path = os.path.join(self.dir, "hosts_" + "_".join(map(str, hosts)) + f"_x{per_host}")
        with open(path, "w") as f:
            for i in hosts:
                f.write(f"{self.address(i)} slots={per_host}\n")
        return path

    def mpirun(self, hosts, per_host, command, extra=()):
        """mpirun on host 1 (it must be in `hosts`) starting per_host ranks on
        each host, in rank order host by host, over TCP on the bed's subnet."""
        assert hosts[0] == 1, "mpirun runs on host 1"
        n = len(hosts) * per_host
        return ([self.script, "on", self.prefix, "1", "--", "mpirun", "--oversubscribe",
                 "--hostfile", self.hostfile(hosts, per_host), "-np", str(n), "--map-by", "slot",
                 "--mca", "plm_rsh_agent", self.agent, "--mca", "btl", "tcp,self",
                 "--mca", "btl_tcp_if_include", self.subnet, "--mca", "oob_tcp_if_include", self.subnet,
                 "-x", "OMP_NUM_THREADS", "-x", "OPENBLAS_NUM_THREADS", "-x", "ASAN_OPTIONS"]
                + list(extra) + [str(c) for c in command])

    def pids(self, i):
        """The processes inside host i's namespace."""
        r = subprocess.run(["ip", "netns", "pids", self.name(i)], capture_output=True, text=True, timeout=10)
        return [int(p) for p in r.stdout.split()]

    def link(self, i, up):
        """Host i's link on the bridge up or down (its veth end in the bridge namespace)."""
        subprocess.run(["ip", "-n", f"{self.prefix}-br", "link", "set", f"v{i}", "up" if up else "down"],
                       check=True, timeout=10)
