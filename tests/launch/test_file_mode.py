"""checkpoint.file_mode reaches the launcher: the run's log dir and every file the launcher writes in it get the
mode (the directory with x); a world-writable mode is refused before the log dir exists, naming the field."""
import os
import stat

import pytest

from data_prep import file_modes
from tests.support.launch import TOY

pytestmark = pytest.mark.unit


@pytest.fixture
def launch_keeping_umask(launch_here, monkeypatch):
    """The launcher in this process (a dry run starts nothing); it sets the process umask and the mode's environment
    variable from the recipe's mode, so the test process gets its own back afterwards (a mode left in os.environ
    would reach every later test's subprocesses)."""
    monkeypatch.setattr(file_modes, "_mode", None)
    monkeypatch.delenv(file_modes.ENV, raising=False)
    old = os.umask(0o022)
    try:
        yield launch_here
    finally:
        os.umask(old)


def _hostfile(tmp_path):
    p = tmp_path / "hostfile"
    p.write_text("gpu001 slots=2\ngpu002 slots=2\n")
    return p


def test_the_launchers_log_dir_and_files_get_the_recipes_mode(tmp_path, launch_keeping_umask):
    logs = tmp_path / "logs"
    r = launch_keeping_umask("train.sh", TOY, "--hostfile", _hostfile(tmp_path), "--backend", "torchrun-ssh",
                             "--dry-run", "--master-port", 23456, "--log-dir", logs, "--", "checkpoint.file_mode=0640")
    assert r.returncode == 0, r.stderr
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in logs.iterdir()}
    assert "plan.txt" in modes and "launch.env" in modes
    assert stat.S_IMODE(logs.stat().st_mode) == 0o750
    assert {n: f"{m:04o}" for n, m in modes.items() if m != 0o640} == {}


def test_without_it_the_launcher_keeps_todays_modes(tmp_path, launch_keeping_umask):
    logs = tmp_path / "logs"
    r = launch_keeping_umask("train.sh", TOY, "--hostfile", _hostfile(tmp_path), "--backend", "torchrun-ssh",
                             "--dry-run", "--master-port", 23456, "--log-dir", logs)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(logs.stat().st_mode) == 0o755
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in logs.iterdir()}["plan.txt"] == 0o644


def test_a_world_writable_mode_is_refused_before_the_log_dir_exists(tmp_path, launch_keeping_umask):
    logs = tmp_path / "logs"
    r = launch_keeping_umask("train.sh", TOY, "--hostfile", _hostfile(tmp_path), "--backend", "torchrun-ssh",
                             "--dry-run", "--log-dir", logs, "--", "checkpoint.file_mode=0666")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "checkpoint.file_mode" in r.stderr and "every user write" in r.stderr and "Traceback" not in r.stderr
    assert not logs.exists()
