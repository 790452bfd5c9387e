"""`python -m data_prep slurm`: sbatch's partition, account, QOS and time limit on every script (the array chunks and
the finalize job), no node list (Slurm chooses), each value checked before anything is written. The scripts run on a
real Slurm in test_dp_slurm.py."""
import subprocess
import sys

import pytest

from data_prep.executors.slurm import render

pytestmark = pytest.mark.unit


def test_request_lines_on_every_script(tmp_path):
    paths = render(["in", "-o", "out", "-t", "tok"], 3, str(tmp_path / "s"), sys.executable, str(tmp_path),
                   time_limit="2-00:00:00", partition="cpu", account="proj-1", qos="low")
    scripts = [p for p in paths if p.endswith(".sbatch")]
    assert [p.rsplit("/", 1)[1] for p in scripts] == ["array_0000.sbatch", "finalize.sbatch"]
    for p in scripts:
        text = open(p).read()
        lines = [line for line in text.splitlines() if line.startswith("#SBATCH --") and
                 line.split("=")[0][10:] in ("time", "partition", "account", "qos")]
        assert lines == ["#SBATCH --time=2-00:00:00", "#SBATCH --partition=cpu", "#SBATCH --account=proj-1",
                         "#SBATCH --qos=low"], p
        assert "--nodelist" not in text and "--exclude" not in text
        assert subprocess.run(["bash", "-n", p]).returncode == 0
    render(["in", "-o", "out", "-t", "tok"], 1, str(tmp_path / "plain"), sys.executable, str(tmp_path))
    plain = (tmp_path / "plain" / "array_0000.sbatch").read_text()  # only what is asked for
    assert "#SBATCH --time=24:00:00" in plain and not any(f"--{k}" in plain for k in ("partition", "account", "qos"))


@pytest.mark.parametrize("kwargs, needle", [
    ({"partition": "cpu\n#SBATCH --nodelist=x"}, "--partition 'cpu"),
    ({"account": "a b"}, "--account 'a b'"),
    ({"qos": "-x"}, "--qos '-x'"),
    ({"time_limit": "one day"}, "--time 'one day': give minutes, HH:MM:SS or D-HH:MM:SS"),
])
def test_bad_values_refused_before_anything_is_written(tmp_path, kwargs, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")) as e:
        render(["in", "-o", "out", "-t", "tok"], 2, str(tmp_path / "s"), sys.executable, str(tmp_path), **kwargs)
    assert needle in str(e.value) and not (tmp_path / "s").exists()
