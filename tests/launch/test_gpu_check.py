"""launch/gpu_check on a CPU machine: prepare.sh really downloads the cp312 wheel folder (PyPI needed) and keeps it under
64 MiB; run.sh --dry installs it offline into a clean venv that sees only torch and runs the GPU check's stages there
(a wheel missing from the folder fails it); the small helpers behave like pip."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from launch.gpu_check import offline  # a plain directory of scripts: a namespace package

REPO = Path(__file__).resolve().parents[2]
GPU_CHECK = REPO / "launch" / "gpu_check"

# prepare.sh downloads from PyPI: the tests that need its folder are in the network tier (out of an offline run, -m
# "not network"); the helpers' tests need nothing but this checkout (unit).


def _env(**extra) -> dict:
    return dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1", **extra)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gpu_check") / "wheels"
    r = subprocess.run(["bash", str(GPU_CHECK / "prepare.sh"), str(out)], cwd=REPO, env=_env(),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "MiB) in" in r.stdout and "limit 64 MiB" in r.stdout  # the size is printed
    return out


@pytest.mark.network
@pytest.mark.timeout(700)
def test_prepare_downloads_every_listed_wheel_for_cp312_under_64_mib(wheels):
    names = {w.name.split("-")[0].lower() for w in wheels.glob("*.whl")}
    listed = [line.split("==")[0].strip().lower().replace("-", "_")
              for line in (GPU_CHECK / "wheels.txt").read_text().splitlines() if line and not line.startswith("#")]
    assert set(listed) <= names
    ds = list(wheels.glob("deepspeed-0.19.8-*.whl"))
    assert [w.name for w in ds] == ["deepspeed-0.19.8-py3-none-any.whl"]  # built pure-python, no op prebuilt
    with zipfile.ZipFile(ds[0]) as z:
        assert not [n for n in z.namelist() if n.endswith(".so")]
    assert sum(w.stat().st_size for w in wheels.glob("*.whl")) < 64 * 2**20
    assert all(offline.installs_on(w.name, (3, 12)) for w in wheels.glob("*.whl"))
    assert any("cp312-cp312" in w.name for w in wheels.glob("numpy-*.whl"))


@pytest.mark.network
@pytest.mark.timeout(700)
def test_dry_run_resolves_every_import_from_the_wheel_folder(wheels, tmp_path):
    out = tmp_path / "out"
    r = subprocess.run(["bash", str(GPU_CHECK / "run.sh"), "--dry", str(out)], cwd=REPO,
                       env=_env(GPU_WHEELS=str(wheels)), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    image = next(line for line in r.stdout.splitlines() if line.startswith("torch image:"))
    assert "torch" in image.split() and "numpy" not in image.split()  # the clean venv gets numpy from the wheels only
    result = json.loads((out / "gpu_check.json").read_text())
    assert result["dry"] and result["environment"]["deepspeed"] == "0.19.8"
    assert all(s["status"] == "ok" for s in result["stages"].values()), result["stages"]
    assert "skipped" in result["stages"]["tests_gpu"]["summary"]  # collected and skipped: no CUDA here
    assert [b["micro_batch"] for b in result["bench"]] == [2] and result["bench"][0]["tokens_per_s"] > 0
    assert result["compare"]["megatron_core"]["parameters"] == result["compare"]["plain_pytorch"]["parameters"]
    assert (out / "profile.txt").read_text().count("aten::") > 5
    assert (out / "run.log").is_file()
    runs = result["stages"]["pipeline"]["runs"]  # zero-bubble (interleaved, vpp 2) ran on CPU, its bubble measured
    assert sorted(runs) == ["zero_bubble"]
    assert all(r["pp_bubble"] is not None and r["step_time_s"] > 0 for r in runs.values()), runs


@pytest.mark.network
@pytest.mark.timeout(700)
def test_dry_run_fails_when_the_folder_lacks_a_wheel(wheels, tmp_path):
    partial = tmp_path / "wheels"
    shutil.copytree(wheels, partial, ignore=shutil.ignore_patterns("hjson-*"))  # deepspeed imports hjson
    shutil.copytree(Path(f"{wheels}-dry"), Path(f"{partial}-dry"))
    out = tmp_path / "out"
    r = subprocess.run(["bash", str(GPU_CHECK / "run.sh"), "--dry", str(out)], cwd=REPO,
                       env=_env(GPU_WHEELS=str(partial), GPU_CHECK_BUDGET_S="200"), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode != 0
    assert "No module named 'hjson'" in (out / "run.log").read_text()


@pytest.mark.unit
def test_wheel_tags_accept_what_pip_on_cp312_accepts():
    ok = ["numpy-2.4.6-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
          "psutil-7.2.2-cp36-abi3-manylinux2010_x86_64.manylinux_2_12_x86_64.manylinux_2_28_x86_64.whl",
          "ninja-1.13.2-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", "tqdm-4.70.1-py3-none-any.whl"]
    bad = ["numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.whl", "numpy-2.4.6-cp312-cp312-musllinux_1_2_x86_64.whl",
           "numpy-2.4.6-cp312-cp312-manylinux_2_34_x86_64.whl", "x-1.0-cp313-abi3-manylinux_2_17_x86_64.whl",
           "numpy-2.4.6-cp312-cp312-manylinux_2_17_aarch64.whl"]
    assert all(offline.installs_on(n, (3, 12)) for n in ok)
    assert not any(offline.installs_on(n, (3, 12)) for n in bad)


@pytest.mark.unit
def test_size_check_fails_over_the_limit(tmp_path, capsys):
    (tmp_path / "a-1.0-py3-none-any.whl").write_bytes(b"\0" * 3 * 2**20)
    assert offline.report_size(tmp_path, 64) == 0
    assert offline.report_size(tmp_path, 2) == 1
    assert "over the 2 MiB" in capsys.readouterr().err


@pytest.mark.unit
def test_unpack_without_pip_gives_what_pip_installs(tmp_path):
    """The fallback for an image without pip: same files as `pip install --no-deps --target`."""
    wheel = tmp_path / "demo_pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("demo_pkg/__init__.py", "X = 1\n")
        z.writestr("demo_pkg-1.0.data/purelib/demo_extra.py", "Y = 2\n")
        z.writestr("demo_pkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n")
        z.writestr("demo_pkg-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                   "Tag: py3-none-any\n")
        z.writestr("demo_pkg-1.0.dist-info/RECORD", "")
    offline.unpack([wheel], tmp_path / "ours")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--target",
                    str(tmp_path / "pips"), str(wheel)], check=True, capture_output=True)

    def files(root):
        return {p.relative_to(root).as_posix() for p in root.rglob("*.py")}

    assert files(tmp_path / "ours") == files(tmp_path / "pips") == {"demo_pkg/__init__.py", "demo_extra.py"}
