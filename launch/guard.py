"""The launcher-death watchdog: SIGKILL (the OOM killer, `kill -9`) runs no handler, so a small shell in its own
session waits on a pipe that only the launcher holds open. When the launcher ends normally it writes `done` and the
shell exits; when it dies the kernel closes the pipe, the read sees end-of-file, and the shell runs the stop command
(`python -m launch stop ...`: by run id on every node). No polling, no Python until it is needed."""
from __future__ import annotations

import os
import subprocess

from launch.common import REPO_DIR, python

_SCRIPT = 'read -r line; [ "$line" = done ] && exit 0; echo "$0"; exec "$@"'


class Guard:
    def __init__(self, stop_args: list[str], log_path: str, what: str):
        read_end, self._write_end = os.pipe()  # neither end is inherited by any other child (close_fds, O_CLOEXEC)
        env = {k: v for k, v in os.environ.items() if k != "LAUNCH_RUN_ID"}  # the stop must not find itself
        banner = f"[launch] the launcher (pid {os.getpid()}) died: stopping {what} on all nodes"
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(["sh", "-c", _SCRIPT, banner, python(), "-m", "launch", "stop", *stop_args],
                                         stdin=read_end, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_DIR, env=env,
                                         start_new_session=True)
        os.close(read_end)

    def release(self) -> None:
        """The launcher is ending normally (it stopped or finished its run itself)."""
        if self._write_end is None:
            return
        try:
            os.write(self._write_end, b"done\n")
        finally:
            os.close(self._write_end)
            self._write_end = None
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
