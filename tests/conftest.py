"""Every test belongs to exactly one tier (pytest.ini lists them): a test without one would silently fall out of
`pytest -m unit` and of every tier, so collection refuses it."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

TIERS = ("unit", "multiproc", "ssh", "gpu", "network")


def _unit_tier_only(config) -> bool:
    return (config.getoption("markexpr") or "").strip() == "unit"


def _marks_unit(path: Path) -> bool:
    return "mark.unit" in path.read_text()


def pytest_ignore_collect(collection_path, config):
    """`-m unit` does not import a test file that marks no test unit: half the files, several of which import torch,
    DeepSpeed or megatron-core at the top (~1.5 s of CPU less per worker). Exact: a tier is written
    `pytest.mark.<tier>` in the test's own file, which every full collection checks below."""
    name = collection_path.name
    if _unit_tier_only(config) and name.startswith("test_") and name.endswith(".py") and not _marks_unit(collection_path):
        return True
    return None


def pytest_collection_modifyitems(config, items):
    wrong = []
    unit_files: dict[Path, bool] = {}
    for item in items:
        tiers = [t for t in TIERS if item.get_closest_marker(t)]
        if len(tiers) != 1:
            wrong.append(f"{item.nodeid}: tiers {tiers or 'none'}")
        elif tiers == ["unit"] and not unit_files.setdefault(item.path, _marks_unit(item.path)):
            wrong.append(f"{item.nodeid}: unit, but its file never says `pytest.mark.unit` (`-m unit` skips such files)")
    if wrong:
        raise pytest.UsageError("each test needs exactly one tier marker (pytestmark = pytest.mark.unit / multiproc "
                                "/ ssh / gpu / network):\n  " + "\n  ".join(wrong))


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A real one-node Slurm cluster (munged + slurmctld + slurmd, tests/support/slurm.py) for the whole session,
    stopped with every job process at the end. Skipped only where the packages cannot be installed."""
    from tests.support.slurm import installable, slurm_cluster, unavailable

    why = unavailable()
    if why:
        if installable() and "missing" in why:
            pytest.fail(f"no Slurm to test against: {why}")
        pytest.skip(f"no Slurm on this machine and it cannot be installed here (needs root and apt-get): {why}")
    with slurm_cluster(str(tmp_path_factory.mktemp("slurm"))) as cluster:
        yield cluster


@pytest.fixture(autouse=True)
def _process_state_restored():
    """A test that runs a launcher or a CLI in this process may change process-wide state: a file mode
    (data_prep.file_modes.apply sets the umask and RECIPES_FILE_MODE), no visible GPU (reshape / export-hf /
    import-hf default CUDA_VISIBLE_DEVICES to ""). Left behind, it would reach every later test and its subprocesses
    (on a GPU machine the GPU tier would see no GPU)."""
    from data_prep import file_modes

    umask, mode = os.umask(0o022), file_modes._mode
    os.umask(umask)
    env = {k: os.environ.get(k) for k in (file_modes.ENV, "CUDA_VISIBLE_DEVICES")}
    yield
    os.umask(umask)
    file_modes._mode = mode
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(autouse=True)
def _rank_forks_outside_the_unit_tier(request):
    """The launcher tests' forking venv (tests/support/rank_forks.py) costs a template start (~8 s of one core) that
    a unit test, which starts no rank, should not pay."""
    from tests.support import rank_forks

    rank_forks.allowed = request.node.get_closest_marker("unit") is None
