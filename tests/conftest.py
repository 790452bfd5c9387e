"""Every test belongs to exactly one tier (pytest.ini lists them): a test without one would silently fall out of
`pytest -m unit` and of every tier, so collection refuses it."""
from __future__ import annotations

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
