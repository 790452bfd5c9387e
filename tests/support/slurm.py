"""A real one-node Slurm cluster on this machine for the tests: munged, slurmctld and slurmd from Debian's packages
(launch/install_system_deps.sh installs them), each with a private config, key, socket, state and spool directory
under a temporary directory, on free loopback ports. Nothing is read from or written to /etc/slurm or /etc/munge, so
it coexists with a system Slurm and with another test session's cluster.

Clients find it through SLURM_CONF (``SlurmCluster.env``); job steps inherit it (sbatch's default --export=ALL).
``SlurmCluster(root, nodes=("nodea", "nodeb"))`` gives several nodes: one slurmd each (`slurmd -N NAME`, its own port,
spool, pid and log file), all on this machine, so that a test can drain one and see a job land on another.
On stop, every job is cancelled and every process that carries this cluster's SLURM_CONF (daemons, slurmstepd, job
processes) is killed: nothing outlives the test session.

As a command, it runs another one inside a cluster:
    python tests/support/slurm.py -- launch/train.sh tests/launch/toy.yaml --hostfile H --backend slurm ...
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional

from recipes.parallel.rendezvous import free_port

DAEMONS = {"munged": "/usr/sbin/munged", "slurmctld": "/usr/sbin/slurmctld", "slurmd": "/usr/sbin/slurmd"}
CLIENTS = ("sbatch", "srun", "sinfo", "squeue", "scontrol", "scancel")


def unavailable() -> Optional[str]:
    """Why a Slurm cluster cannot be started here, or None if it can."""
    missing = [p for p in DAEMONS.values() if not os.path.exists(p)] + [c for c in CLIENTS if not shutil.which(c)]
    if missing:
        return (f"{', '.join(missing)} missing: install the Debian packages slurm-wlm and munge "
                "(bash launch/install_system_deps.sh)")
    if os.geteuid() != 0:
        return "slurmd must run as root to start jobs (SlurmdUser=root); run the tests as root"
    return None


def installable() -> bool:
    """Whether launch/install_system_deps.sh could install the packages here (root or sudo, and apt-get)."""
    return bool(shutil.which("apt-get")) and (os.geteuid() == 0 or bool(shutil.which("sudo")))


def _node_line(name: str, extra: str = "") -> str:
    """The node's hardware as slurmd itself detects it (CPUs, sockets, cores, memory), so slurmctld never drains it
    for a mismatch; on a machine where `slurmd -C` says nothing useful, 2 CPUs."""
    r = subprocess.run([DAEMONS["slurmd"], "-C"], capture_output=True, text=True)
    words = r.stdout.split("\n")[0].split() if r.returncode == 0 else []
    hw = [w for w in words if w.split("=")[0] in ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket",
                                                  "ThreadsPerCore", "RealMemory")]
    return f"NodeName={name} {extra}NodeAddr=127.0.0.1 " + (" ".join(hw) or "CPUs=2") + " State=UNKNOWN"


def build_spank_plugin(source: Path, out_dir: Path) -> Path:
    """Compile a SPANK plugin (C, against Debian's libslurm-dev headers) into out_dir; RuntimeError saying what is
    missing."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc or not os.path.exists("/usr/include/slurm/spank.h"):
        raise RuntimeError("building a SPANK plugin needs a C compiler and <slurm/spank.h>: bash "
                           "launch/install_system_deps.sh (gcc, libslurm-dev)")
    out = out_dir / (source.stem + ".so")
    r = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-o", str(out), str(source)], capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise RuntimeError(f"cc failed on {source}:\n{r.stderr}")
    return out


class SlurmCluster:
    def __init__(self, root: str, nodes: Optional[List[str]] = None, plugins: Optional[List[str]] = None):
        self.root = Path(root)
        self.host = socket.gethostname().split(".")[0]
        self.nodes = list(nodes) if nodes else [self.host]  # node names (the machine's own name by default)
        self.node = self.nodes[0]
        self.plugins = list(plugins or [])  # SPANK plugins (.so paths) for plugstack.conf, e.g. a pyxis stand-in
        self.conf = self.root / "slurm.conf"
        self.env: Dict[str, str] = dict(os.environ, SLURM_CONF=str(self.conf))
        for var in [v for v in self.env if v.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))]:
            if var != "SLURM_CONF":  # a surrounding job's settings would leak into ours
                del self.env[var]
        self.procs: List[subprocess.Popen] = []

    # --- setup -------------------------------------------------------------------------------------------------
    def _write_config(self) -> None:
        r = self.root
        for d in ("munge", "state", "spool", "log"):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "munge", 0o700)  # munged refuses a socket/key directory others can write to
        key = r / "munge" / "munge.key"
        with open(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400), "wb") as f:
            f.write(os.urandom(1024))
        ctld_port, slurmd_port = free_port(), free_port()
        several = self.nodes != [self.host]  # one slurmd per node: each its own port, spool, pid and log file
        per = "/%n" if several else ""
        node_lines = [_node_line(n, f"NodeHostname={self.host} Port={free_port()} " if several else "")
                      for n in self.nodes]
        for n in self.nodes if several else []:
            (r / "spool" / n).mkdir(parents=True, exist_ok=True)
        self.conf.write_text("\n".join([
            "ClusterName=testcluster",
            f"SlurmctldHost={self.host}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"AuthInfo=socket={r / 'munge' / 'munge.socket'}",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}{per}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd'}{'-%n' if several else ''}.pid",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log' / 'slurmd'}{'-%n' if several else ''}.log",
            f"PlugStackConfig={r / 'plugstack.conf'}",
            # No cgroups in a container: processes are tracked by parent pid, tasks are not bound to cores.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "ReturnToService=2",
            # Short waits: a cancelled or requeued job's processes get SIGTERM, then SIGKILL after KillWait;
            # finished jobs stay visible to scontrol for MinJobAge seconds (the tests read their exit codes).
            "KillWait=10",
            "MinJobAge=600",
            "SchedulerParameters=sched_interval=2",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            *node_lines,
            f"PartitionName=debug Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO",
            "",
        ]))
        # not the system's /etc/slurm/plugstack.conf: none, or the plugins asked for
        (r / "plugstack.conf").write_text("".join(f"required {p}\n" for p in self.plugins))

    def _spawn(self, name: str, args: List[str], tag: str = "") -> None:
        with open(self.root / "log" / f"{name}{tag}.stderr", "w") as log:
            self.procs.append(subprocess.Popen([DAEMONS[name], *args], env=self.env, stdin=subprocess.DEVNULL,
                                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def start(self, timeout: float = 60) -> None:
        self._write_config()
        m = self.root / "munge"
        self._spawn("munged", ["-F", "--force", f"--key-file={m / 'munge.key'}", f"--socket={m / 'munge.socket'}",
                               f"--pid-file={m / 'munged.pid'}", f"--log-file={self.root / 'log' / 'munged.log'}",
                               f"--seed-file={m / 'munged.seed'}"])
        self._wait(lambda: (m / "munge.socket").exists(), timeout, "munged never created its socket")
        self._spawn("slurmctld", ["-D", "-i", "-f", str(self.conf)])  # -i: ignore (absent) saved state
        for n in self.nodes:
            self._spawn("slurmd", ["-D", "-f", str(self.conf), "-N", n], tag="" if len(self.nodes) == 1 else f"-{n}")
        for n in self.nodes:
            self._wait(lambda: self.node_idle(n), timeout, f"node {n} never became idle in sinfo")

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if ready():
                return
            dead = [p for p in self.procs if p.poll() is not None]
            if dead:
                break
            time.sleep(0.3)
        raise RuntimeError(f"{what}; logs in {self.root / 'log'}:\n{self.logs_tail()}")

    def node_idle(self, node: Optional[str] = None) -> bool:
        """Idle and done with any previous job. PLANNED (the scheduler has set the node aside for a pending job, e.g.
        one just requeued) still counts: sinfo then says "mixed" although nothing runs there."""
        return set(self.node_state(node).split("+")) - {"PLANNED"} == {"IDLE"}

    def node_state(self, node: Optional[str] = None) -> str:
        """scontrol's State of the node: IDLE, ALLOCATED, MIXED, ... with its flags (IDLE+DRAIN, IDLE+COMPLETING)."""
        r = self.run("scontrol", "-o", "show", "node", node or self.node, check=False)
        return next((w[6:] for w in r.stdout.split() if w.startswith("State=")), "") if r.returncode == 0 else ""

    def logs_tail(self, lines: int = 15) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*")):
            out.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(out)

    # --- use ---------------------------------------------------------------------------------------------------
    def run(self, *cmd: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        r = subprocess.run(list(cmd), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
        return r

    def jobs(self, job_id: str) -> List[Dict[str, str]]:
        """scontrol's fields (JobState, ExitCode, Restarts, ArrayTaskId, ...) of a job, or of each task of an array."""
        r = self.run("scontrol", "-o", "show", "job", str(job_id))
        return [dict(w.split("=", 1) for w in line.split() if "=" in w) for line in r.stdout.splitlines()]

    def job(self, job_id: str) -> Dict[str, str]:
        return self.jobs(job_id)[0]

    def wait_job(self, job_id: str, timeout: float = 120, states=("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                                                      "NODE_FAIL", "OUT_OF_MEMORY")) -> Dict[str, str]:
        """Until the job (every task of an array) is in one of ``states``; returns the last task's fields."""
        deadline = time.time() + timeout
        while True:
            jobs = self.jobs(job_id)
            if jobs and all(j["JobState"] in states for j in jobs):
                return jobs[-1]
            if time.time() > deadline:
                raise TimeoutError(f"job {job_id} not finished after {timeout} s: "
                                   f"{[(j['JobId'], j['JobState']) for j in jobs]}\n{self.logs_tail()}")
            time.sleep(0.5)

    # --- teardown ----------------------------------------------------------------------------------------------
    def _our_pids(self) -> List[int]:
        """Every process started for this cluster: daemons, slurmstepd and job processes all carry its SLURM_CONF."""
        mark = f"SLURM_CONF={self.conf}".encode()
        pids = []
        for p in Path("/proc").iterdir():
            if p.name.isdigit() and int(p.name) != os.getpid():
                with contextlib.suppress(OSError):
                    if mark in (p / "environ").read_bytes().split(b"\0"):
                        pids.append(int(p.name))
        return pids

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.run("scancel", "--full", f"--user={os.getuid()}", "--partition=debug", check=False, timeout=10)
        # slurmd before slurmctld: no node-down handling on the way out; munged last (the others talk to it).
        for p in reversed(self.procs):
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        deadline = time.time() + 5
        while (pids := self._our_pids()) and time.time() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        left = self._our_pids()
        if left:
            raise RuntimeError(f"processes of the test Slurm cluster outlived it: {left}")


@contextlib.contextmanager
def slurm_cluster(root: str, nodes: Optional[List[str]] = None,
                  plugins: Optional[List[str]] = None) -> Iterator[SlurmCluster]:
    cluster = SlurmCluster(root, nodes, plugins)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cmd = argv[1:] if argv[:1] == ["--"] else argv
    if not cmd:
        print(__doc__, file=sys.stderr)
        return 2
    why_not = unavailable()
    if why_not:
        print(f"cannot start a Slurm cluster: {why_not}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="slurm_cluster_") as d, slurm_cluster(d) as cluster:
        with open(os.path.join(d, "hostfile"), "w") as f:
            f.write(f"{cluster.node} slots=2\n")
        return subprocess.call(cmd, env=dict(cluster.env, LAUNCH_HOSTFILE=os.path.join(d, "hostfile")))


if __name__ == "__main__":
    sys.exit(main())
