"""`python -m launch COMMAND ...`: the commands behind launch/train.sh, preflight.sh, stop.sh and prep.sh (same
arguments, same exit codes), and the two that run on nodes or in a Slurm job (stop --local / --signal-local,
report-failure). Errors are one `[launch] error: ...` line (exit 2 for arguments, 3 layout, 4 nodes, 5 lease)."""
from __future__ import annotations

import signal
import sys

from launch.common import Interrupted, LaunchError, setup_logging

USAGE = """usage: python -m launch {train,preflight,stop,prep} ...   (launch/train.sh, preflight.sh, stop.sh, prep.sh)
       python -m launch report-failure EXIT_DIR LOG_DIR TEXT          (the Slurm job script)"""


def _interrupt(signum, frame):
    raise Interrupted()


def stop_main(argv: list[str]) -> int:
    from launch import stop

    if not argv or argv[0] in ("-h", "--help"):
        print(stop.__doc__, file=sys.stderr)
        if not argv:
            raise LaunchError("give the run to stop: launch/stop.sh RUN_DIR (the run's --log-dir) or RUN_ID (under "
                              "runs/launch/); a stop never guesses which run", 2)
        return 0
    grace = None
    if "--grace" in argv:
        k = argv.index("--grace")
        grace, argv = float(argv[k + 1]), argv[:k] + argv[k + 2:]
    if argv[0] == "--local" and len(argv) == 2:
        print(stop.stop_local(argv[1], stop.grace_of(None) if grace is None else grace), flush=True)
        return 0
    if argv[0] == "--signal-local" and len(argv) >= 3:
        print("\n".join(stop.signal_local(argv[1], argv[2], argv[3:])), flush=True)
        return 0
    if argv[0] == "--on" and len(argv) == 3:  # the data prep's guard: these hosts, this run id
        rc, text = stop.stop_hosts(stop.Ssh(), argv[1].split(","), argv[2], grace or stop.grace_of(None))
        print(text, end="", flush=True)
        return rc
    if argv[0] == "--by-launcher" and len(argv) == 2:  # the launcher (or its guard) stopping its own run
        return stop.stop_run(argv[1], by_launcher=True)
    if len(argv) == 1 and not argv[0].startswith("-"):
        return stop.stop_run(argv[0])
    raise LaunchError(f"stop: cannot read the arguments {' '.join(argv)} (see launch/stop.sh --help)", 2)


def _run(command: str, argv: list[str]) -> int:
    from launch import options

    if command in ("train", "preflight"):
        try:
            opts = options.parse(argv, command)
        except options.HelpRequested:
            print(options.TRAIN_USAGE if command == "train" else options.PREFLIGHT_USAGE, file=sys.stderr)
            return 0
        if command == "train":
            from launch.train import train

            return train(opts)
        from launch.preflight import preflight

        return preflight(opts)
    if command == "stop":
        return stop_main(argv)
    if command == "prep":
        from launch.prep import prep

        return prep(argv)
    if command == "report-failure" and len(argv) == 3:
        from launch import failures

        return failures.main(argv)
    print(USAGE, file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[1:2] in (["--version"], ["-V"]):  # `launch/train.sh --version`: the installed distribution's version
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"llm-recipes {version('llm-recipes')}")
        except PackageNotFoundError:
            print("llm-recipes (not installed: pip install -e . or launch/setup_env.sh)")
        return 0
    setup_logging()
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, _interrupt)
    return run(argv)


def run(argv: list[str]) -> int:
    """One command, its errors printed as `[launch] error: ...` with their exit code (the tests call this in
    process for dry runs; `main` adds the signal handlers and the log line's handler)."""
    try:
        return _run(argv[0] if argv else "", argv[1:])
    except LaunchError as e:
        print(f"[launch] error: {e}", file=sys.stderr)
        return e.code
    except Interrupted:
        print("[launch] interrupted", file=sys.stderr)
        return 130
