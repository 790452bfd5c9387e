"""Every test belongs to exactly one tier (pytest.ini lists them): a test without one would silently fall out of
`pytest -m unit` and of every tier, so collection refuses it."""
from __future__ import annotations

import os

import pytest

TIERS = ("unit", "multiproc", "ssh", "gpu", "network")


def pytest_collection_modifyitems(config, items):
    wrong = []
    for item in items:
        tiers = [t for t in TIERS if item.get_closest_marker(t)]
        if len(tiers) != 1:
            wrong.append(f"{item.nodeid}: tiers {tiers or 'none'}")
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
def _process_file_mode_restored():
    """A test that runs a launcher or a CLI in this process may apply a file mode (data_prep.file_modes.apply sets
    the umask and RECIPES_FILE_MODE); left behind, it would reach every later test's subprocesses."""
    from data_prep import file_modes

    umask, mode, env = os.umask(0o022), file_modes._mode, os.environ.get(file_modes.ENV)
    os.umask(umask)
    yield
    os.umask(umask)
    file_modes._mode = mode
    if env is None:
        os.environ.pop(file_modes.ENV, None)
    else:
        os.environ[file_modes.ENV] = env
