"""ssh with the launcher's own options: LAUNCH_SSH_CONFIG (aliases, ports, keys; never a file from a run directory),
BatchMode (never hang on a password prompt), a connect timeout. A host is always its own argument after `--`, checked
with the hostfile's host rule; only text this launcher rendered (every word quoted) becomes the remote command."""
from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import socket
import subprocess
from pathlib import Path
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from launch import run_files
from launch.common import REPO_DIR, LaunchError, python, say
from launch.hostfile import valid_host


@functools.cache
def _dies_with_launcher() -> tuple[str, ...]:
    """A prefix that makes the ssh client die (SIGKILL) when the launcher that started it does, on Linux (util-linux
    setpriv; nothing where it is missing). Without it a SIGKILLed launcher left its ssh clients running: one still
    connecting started its remote command after the launcher's guard had stopped the run on every node, and that
    slice or rank ran on, orphaned. The signal follows the launcher's thread that started the client: every client
    that outlives its call is started by the launcher's main thread."""
    setpriv = shutil.which("setpriv")
    ok = setpriv and "--pdeathsig" in subprocess.run([setpriv, "--help"], capture_output=True, text=True).stdout
    return (setpriv, "--pdeathsig", "KILL", "--") if ok else ()


SHIM_PREFIX = "launch-ssh."


def _pid_namespace() -> str:
    """This process's pid namespace (its inode): a pid means a process only inside it (containers sharing /tmp)."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "0"


def _shim_prefix(pid: int) -> str:
    """The shim dir's name up to mkdtemp's suffix: the launcher's pid, host and pid namespace (a temp dir shared
    between hosts or containers keeps the others')."""
    return f"{SHIM_PREFIX}{pid}.{socket.gethostname()}.{_pid_namespace()}."


def _remove_stale_shims(tmp: str | None = None) -> None:
    """A SIGKILLed launcher cannot remove its ssh shim's directory (``Ssh.close``): the next launch removes this
    user's directories on this host whose launcher is gone (the pid in the name; one that is alive, or another
    user's or host's, is kept)."""
    tmp = tmp or tempfile.gettempdir()
    try:
        names = os.listdir(tmp)
    except OSError:
        return
    for name in names:
        if not name.startswith(SHIM_PREFIX):
            continue
        pid = name[len(SHIM_PREFIX):].split(".")[0]
        # ASCII digits only (str.isdigit takes '²'), and this host's and pid namespace's, named by a launcher
        if not (re.fullmatch(r"[0-9]{1,10}", pid) and name.startswith(_shim_prefix(int(pid)))):
            continue
        path = os.path.join(tmp, name)
        try:
            if os.lstat(path).st_uid != os.getuid():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except OSError:  # gone meanwhile, or a live process of another user
            pass


class Ssh:
    def __init__(self, environ=os.environ):
        self.config = environ.get("LAUNCH_SSH_CONFIG", "")
        self.opts = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={environ.get('LAUNCH_SSH_TIMEOUT', '10')}"]
        if self.config:
            if not (os.path.isfile(self.config) and os.access(self.config, os.R_OK)):
                raise LaunchError(f"LAUNCH_SSH_CONFIG={self.config} is not a readable file")
            self.opts = ["-F", self.config] + self.opts
        self._shim_dir: str | None = None

    def argv(self, host: str, command: str) -> list[str]:
        if not valid_host(host):
            raise LaunchError(f"'{host}' is not a host name (letters, digits and _.-[]:, not starting with '-')")
        return [*_dies_with_launcher(), "ssh", *self.opts, "--", host, command]

    def run(self, host: str, command: str, input: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(host, command), input=input, capture_output=True, text=True,
                              stdin=None if input is not None else subprocess.DEVNULL)

    def run_all(self, hosts: list[str], command_of: Callable[[str], str], input: str | None = None
                ) -> dict[str, subprocess.CompletedProcess]:
        """The command on every host at once; host -> its result."""
        if not hosts:
            return {}
        with ThreadPoolExecutor(max_workers=min(64, len(hosts))) as pool:
            results = pool.map(lambda h: self.run(h, command_of(h), input), hosts)
            return dict(zip(hosts, results))

    def resolve_addr(self, host: str) -> str:
        """The address other nodes reach `host` at: ssh's resolved HostName (so ssh aliases work), else the name."""
        r = subprocess.run(["ssh", *self.opts, "-G", "--", host], capture_output=True, text=True,
                           stdin=subprocess.DEVNULL)
        for line in r.stdout.splitlines():
            key, _, value = line.partition(" ")
            if key == "hostname" and value:
                return value
        return host

    def tool_env(self) -> dict[str, str]:
        """For tools that run ssh themselves (pdsh, DeepSpeed's runner): a one-line `ssh` wrapper first on PATH that
        adds -F LAUNCH_SSH_CONFIG, and pdsh's own variable for it. Empty without a config."""
        if not self.config:
            return {}
        if self._shim_dir is None:
            real = shutil.which("ssh")
            if not real:
                raise LaunchError("ssh is not installed (apt-get install openssh-client)")
            _remove_stale_shims()
            self._shim_dir = tempfile.mkdtemp(prefix=_shim_prefix(os.getpid()))
            shim = os.path.join(self._shim_dir, "ssh")
            with open(shim, "w") as f:
                f.write(f'#!/bin/sh\nexec {shlex.quote(real)} -F {shlex.quote(self.config)} "$@"\n')
            os.chmod(shim, 0o700)
        return {"PATH": f"{self._shim_dir}:{os.environ.get('PATH', '')}",
                "PDSH_SSH_ARGS_APPEND": f"{os.environ.get('PDSH_SSH_ARGS_APPEND', '')} -F {self.config}".strip()}

    def close(self) -> None:
        if self._shim_dir:
            shutil.rmtree(self._shim_dir, ignore_errors=True)
            self._shim_dir = None


def check_reachable(ssh: Ssh, hosts: list[str]) -> bool:
    """ssh, this repository and its venv on every host, in parallel; one line per host that is not ready."""
    probe = f"test -x {shlex.quote(python())} && test -d {shlex.quote(str(REPO_DIR / 'recipes'))} && echo ok"
    ok = True
    for host, r in ssh.run_all(hosts, lambda h: probe).items():
        if "ok" not in r.stdout.split():
            say(f"node {host}: NOT ready: {(r.stdout + r.stderr).replace(chr(10), ' ')[:300]}")
            say(f"  fix: passwordless ssh to {host} (ssh {host} true), and this repo + venv at {REPO_DIR} on it")
            ok = False
    return ok


def push_private_file(ssh: Ssh, hosts: list[str], path: str) -> bool:
    """The file to every host at the same path over ssh's stdin (never its command line), created 0600 under a fresh
    name and renamed; on a shared file system each node replaces it with the same bytes."""
    text = run_files.read(Path(path))
    d, name = shlex.quote(os.path.dirname(path)), os.path.basename(path)
    cmd = (f"umask 077 && mkdir -p {d} && t=$(mktemp {d}/{shlex.quote('.' + name)}.XXXXXX) && cat >\"$t\" && "
           f"mv -f \"$t\" {shlex.quote(path)}")
    ok = True
    for host, r in ssh.run_all(hosts, lambda h: cmd, input=text).items():
        if r.returncode != 0:
            say(f"node {host}: cannot write {path}: {r.stderr.replace(chr(10), ' ')[:300]}")
            ok = False
    return ok


def drop_file(ssh: Ssh, hosts: list[str], path: str) -> None:
    """Best effort, at exit: the ranks read it when they started."""
    ssh.run_all(hosts, lambda h: f"rm -f {shlex.quote(path)}")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
