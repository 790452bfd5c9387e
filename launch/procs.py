"""The processes the launcher starts for an attempt (what a back end rendered) and where their output goes: each
node's output into LOG_DIR/<host>.log (and the terminal unless --quiet); pdsh's `host: text` lines split into the
per-host logs. Output is only ever copied: a line's text is compared with the plan's host names, never run or used
as a path."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from launch.backends.base import Spawn


class NodeProcess:
    def __init__(self, spawn: Spawn, log_dir: Path, quiet: bool):
        self.name = spawn.name
        self._threads: list[threading.Thread] = []
        self._files = []
        if spawn.demux_hosts:
            logs = {h.encode(): self._open(log_dir / f"{h}.log") for h in spawn.demux_hosts}
            sink = (self._demux, (logs, self._open(log_dir / "launcher.log"), quiet))
        else:
            log = self._open(log_dir / f"{spawn.name}.log")
            sink = None if quiet else (self._tee, (log,))
        out = subprocess.PIPE if sink else log
        self.popen = subprocess.Popen(spawn.argv, env=spawn.env, cwd=spawn.cwd, stdin=subprocess.DEVNULL,
                                      stdout=out, stderr=subprocess.STDOUT, start_new_session=spawn.own_session)
        if sink:
            t = threading.Thread(target=sink[0], args=(self.popen.stdout, *sink[1]), daemon=True)
            t.start()
            self._threads.append(t)

    def _open(self, path: Path):
        f = open(path, "ab", buffering=0)
        self._files.append(f)
        return f

    @staticmethod
    def _echo(data: bytes) -> bool:
        """To the terminal; False once it is gone (a closed pipe must not stop the copy into the logs, or the node's
        output would back up and block its ranks)."""
        try:
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
            return True
        except (OSError, ValueError):
            return False

    def _tee(self, pipe, log) -> None:
        fd, echo = pipe.fileno(), True
        while chunk := os.read(fd, 1 << 16):
            log.write(chunk)
            echo = echo and self._echo(chunk)

    def _demux(self, pipe, logs: dict, launcher_log, quiet: bool) -> None:
        echo = not quiet
        for line in pipe:  # bytes, split at \n only (a progress bar's \r stays inside its line)
            host, sep, text = line.partition(b": ")
            target = logs.get(host) if sep else None
            (target or launcher_log).write(text if target else line)
            echo = echo and self._echo(line)

    def poll(self) -> int | None:
        return self.popen.poll()

    def finish(self, deadline: float) -> int:
        """Wait for the process until `deadline` (monotonic), then kill it; its output drained, its logs closed."""
        while self.popen.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if self.popen.poll() is None:
            self.popen.kill()
        rc = self.popen.wait()
        for t in self._threads:
            t.join(timeout=5)
        for f in self._files:
            f.close()
        return rc
