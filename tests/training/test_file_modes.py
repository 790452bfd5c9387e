"""checkpoint.file_mode on a real run: every file a training run writes (DeepSpeed's own checkpoint files, our
markers, the async writer's files, the data cache, metrics.jsonl and TensorBoard events), a sync save after a
resume, a reshape (both writers) and an export-hf of its checkpoint get the mode, every directory the matching mode with
x; without the setting the run leaves today's modes (0644 files, 0755 directories under the usual umask 022)."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from data_prep import file_modes
from tests.support.runs import on_corpus, pretrain, recipes_cli

pytestmark = pytest.mark.multiproc


def _modes(root: Path) -> dict[str, int]:
    """relative path (directories end in /) -> permission bits, for the tree under ``root`` (itself included)."""
    out = {"./": stat.S_IMODE(root.stat().st_mode)}
    for d, dirs, files in os.walk(root):
        for name in dirs:
            path = os.path.join(d, name)
            out[os.path.relpath(path, root) + "/"] = stat.S_IMODE(os.lstat(path).st_mode)
        for name in files:
            out[os.path.relpath(os.path.join(d, name), root)] = stat.S_IMODE(os.lstat(os.path.join(d, name)).st_mode)
    return out


def _off(modes: dict[str, int], file_mode: int, dir_mode: int) -> dict[str, str]:
    """Entries whose mode is not the expected one: directories and DeepSpeed's recovery scripts (zero_to_*.py, copied
    executable) ``dir_mode``, every other file ``file_mode``."""
    def want(p):
        return dir_mode if p.endswith("/") or os.path.basename(p).startswith("zero_to_") else file_mode
    return {p: f"{m:04o}" for p, m in modes.items() if m != want(p)}


@pytest.fixture
def umask_022(monkeypatch):
    monkeypatch.delenv(file_modes.ENV, raising=False)  # a mode inherited from the environment would apply
    old = os.umask(0o022)  # the usual umask: the default run's reference modes depend on it
    yield
    os.umask(old)


def test_a_run_its_async_and_sync_saves_and_a_reshape_write_0640(corpus, tmp_path, umask_022):
    run = tmp_path / "run"
    common = [*on_corpus(run, corpus), "checkpoint.save_interval=3", "checkpoint.file_mode=0640"]
    pretrain(2, *common, "checkpoint.async_save=true", timeout=900)  # saves at steps 3 and 6 by the writer processes
    # resumes; a sync save of step 9
    pretrain(2, *common, "checkpoint.async_save=false", "training.train_steps=9", timeout=900)
    modes = _modes(run)
    assert {"global_step6/", "global_step9/", "global_step6/complete.json", "latest", "recipe.yaml",
            "logs/metrics.jsonl"} <= modes.keys()
    assert any(p.startswith("data_cache/") and p.endswith(".npy") for p in modes)
    assert any("tfevents" in p for p in modes)
    assert _off(modes, 0o640, 0o750) == {}

    for writer in ("stream", "engine"):  # engine: one torchrun rank per target rank (import-hf's writer too)
        out = tmp_path / f"reshaped-{writer}"
        _recipes("reshape", "--checkpoint", run, "--out", out, "--tag", "global_step6", "--to", "tp=1,pp=1,dp=1",
                 "--writer", writer)
        reshaped = _modes(out)
        assert "global_step6/complete.json" in reshaped
        assert _off(reshaped, 0o640, 0o750) == {}, writer

    hf = tmp_path / "hf"
    _recipes("export-hf", "--checkpoint", run, "--out", hf, "--tag", "global_step6")
    exported = _modes(hf)
    assert "config.json" in exported and any(p.endswith(".safetensors") for p in exported)
    assert _off(exported, 0o640, 0o750) == {}


def _recipes(*args) -> None:
    proc = recipes_cli([*map(str, args), "--quiet"], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_without_the_setting_a_run_leaves_todays_modes(corpus, tmp_path, umask_022):
    run = tmp_path / "run"
    pretrain(2, *on_corpus(run, corpus), "checkpoint.save_interval=3", "training.train_steps=3", timeout=900)
    modes = _modes(run)
    assert "global_step3/complete.json" in modes and "logs/metrics.jsonl" in modes
    # today: our files 0644 (data_prep.io), the libraries' 0666 & ~022; directories 0755; DeepSpeed copies its
    # recovery script with its source's mode plus x
    script = {p for p in modes if os.path.basename(p).startswith("zero_to_")}
    assert script and _off({p: m for p, m in modes.items() if p not in script}, 0o644, 0o755) == {}
    assert all(modes[p] & stat.S_IXUSR and not modes[p] & stat.S_IWOTH for p in script)
