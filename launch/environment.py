"""What every rank gets: the plumbing settings (the venv, NCCL_* / GLOO_*, threads, the run id: printed in plans,
passed on command lines), and the user's variables (--env, HF_* / WANDB_* / MLFLOW_*, where tokens live), which
reach the ranks only through a 0600 file that rank_exec.sh reads: never a command line (`ps` shows those to every
user of a node), a plan, a job script or a log; only their names are printed."""
from __future__ import annotations

import re
from pathlib import Path

from launch.common import LaunchError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PLUMBING = re.compile(r"^(NCCL_|GLOO_|TORCH_NCCL_|TORCH_DISTRIBUTED_|CUDA_DEVICE_ORDER$|OMP_NUM_THREADS$)")
_SECRET = re.compile(r"^(HF_|WANDB_|MLFLOW_)")


def plumbing_names(environ) -> list[str]:
    # whole names only: a variable named `NCCL_X;cmd` (names may hold any byte but '=') would reach an `export` line
    return sorted(n for n in environ if _PLUMBING.match(n) and _NAME.match(n))


def secret_names(extra: list[str], environ) -> list[str]:
    """--env / LAUNCH_EXPORT names first, then HF_* / WANDB_* / MLFLOW_*; each once, variable names only."""
    names = list(extra) + sorted(n for n in environ if _SECRET.match(n) and _NAME.match(n))
    return list(dict.fromkeys(n for n in names if n))


def check_names(extra: list[str], environ) -> None:
    """Refuses names that are not variable names, unset variables, and values spanning lines (each variable is one
    NAME=VALUE line of the env files)."""
    for name in extra:
        if not _NAME.match(name):
            raise LaunchError(f"--env '{name}' is not a variable name (letters, digits and _, not starting with a "
                              "digit)", 2)
        if name not in environ:
            raise LaunchError(f"--env {name}: the variable is not set here, so it cannot be propagated", 2)
    for name in plumbing_names(environ) + secret_names(extra, environ):
        if "\n" in environ[name] or "\r" in environ[name]:
            raise LaunchError(f"{name}: the value spans several lines; variables are passed one NAME=VALUE line each: "
                              "unset it or put the text in a file and pass its path", 2)


def launch_env(run_id: str, venv: str, secret_file: str | None, environ, names: list[str] = ()) -> list[str]:
    """NAME=VALUE lines every rank gets (launch.env): nothing secret. With the env file, LAUNCH_ENV_NAMES lists the
    names it may set (`names`): rank_exec.sh exports those and nothing else from it."""
    lines = [f"PATH={venv}/bin:/usr/local/bin:/usr/bin:/bin", f"VIRTUAL_ENV={venv}", "PYTHONUNBUFFERED=1",
             f"LAUNCH_RUN_ID={run_id}"]
    lines += [f"{n}={environ[n]}" for n in plumbing_names(environ)]
    if secret_file:
        lines += [f"LAUNCH_ENV_FILE={secret_file}", f"LAUNCH_ENV_NAMES={' '.join(names)}"]
    first: dict[str, str] = {}
    for line in lines:  # a user's PATH-like plumbing name never replaces ours
        first.setdefault(line.split("=", 1)[0], line)
    return list(first.values())


def write_private(path: Path, text: str) -> None:
    """`text` into `path`, mode 0600 from its creation, never through a planted file or link (launch.run_files)."""
    from launch import run_files

    run_files.write(path, text)


def write_secret_file(path: Path, names: list[str], environ) -> None:
    write_private(path, "".join(f"{n}={environ[n]}\n" for n in names))
