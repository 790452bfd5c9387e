"""Hostfile parsing and selection, and refusals that must happen before any process starts."""
import pytest

from launch.hostfile import HostfileError, parse_hostfile, select_nodes
from tests.support.launch import TOY, run_launch

pytestmark = pytest.mark.unit


def write(tmp_path, text):
    p = tmp_path / "hostfile"
    p.write_text(text)
    return p


def test_comments_blank_lines_and_slots(tmp_path):
    nodes = parse_hostfile(write(tmp_path, "# cluster\n\nworker-1 slots=8  # fat node\n  worker-2 slots=4\n"))
    assert [(n.host, n.slots, n.devices) for n in nodes] == [("worker-1", 8, list(range(8))), ("worker-2", 4, [0, 1, 2, 3])]


@pytest.mark.parametrize("text, needle", [
    ("a slots=2\na slots=2\n", "listed again (first on line 1)"),
    ("a slots=0\n", "slots=0"),
    ("a\n", "has no slot count"),
    ("a slots=two\n", "not a whole number"),
    ("a slots=2 gpus=3\n", "cannot read"),
    ("# only comments\n\n", "no hosts"),
])
def test_bad_hostfiles_name_the_line(tmp_path, text, needle):
    with pytest.raises(HostfileError, match="hostfile") as e:
        parse_hostfile(write(tmp_path, text))
    assert needle in str(e.value)


def test_all_problems_reported_at_once(tmp_path):
    with pytest.raises(HostfileError) as e:
        parse_hostfile(write(tmp_path, "a slots=0\nb slots=1\nb slots=1\n"))
    assert ":1:" in str(e.value) and ":3:" in str(e.value)


def test_include_exclude_and_limits(tmp_path):
    nodes = parse_hostfile(write(tmp_path, "a slots=4\nb slots=4\nc slots=4\n"))
    assert [n.host for n in select_nodes(nodes, include="c@a")] == ["c", "a"]
    sel = select_nodes(nodes, include="a:1,3@b")
    assert [(n.host, n.slots, n.devices) for n in sel] == [("a", 2, [1, 3]), ("b", 4, [0, 1, 2, 3])]
    assert [n.host for n in select_nodes(nodes, exclude="b")] == ["a", "c"]
    sel = select_nodes(nodes, exclude="a:0")
    assert (sel[0].host, sel[0].devices) == ("a", [1, 2, 3])
    sel = select_nodes(nodes, num_nodes=2, num_gpus=2)
    assert [(n.host, n.slots) for n in sel] == [("a", 2), ("b", 2)]
    for kwargs, needle in [({"include": "zz"}, "not in the hostfile"), ({"num_nodes": 4}, "only 3"),
                           ({"num_gpus": 5}, "fewer slots"), ({"include": "a:7"}, "out of range"),
                           ({"include": "a", "exclude": "b"}, "not both")]:
        with pytest.raises(HostfileError, match=needle):
            select_nodes(nodes, **kwargs)


def test_bad_hostfile_refused_before_anything_starts(tmp_path):
    hf = write(tmp_path, "node1 slots=2\nnode1 slots=2\nnode2 slots=0\n")
    logs = tmp_path / "logs"
    r = run_launch("train.sh", TOY, "--hostfile", hf, "--backend", "torchrun-ssh", "--log-dir", logs)
    assert r.returncode == 2
    assert f"{hf}:2: 'node1' is listed again" in r.stderr and f"{hf}:3: 'node2' has slots=0" in r.stderr
    assert not logs.exists()  # refused before a log dir, let alone a process


def test_world_size_mismatch_refused_with_the_fix(tmp_path):
    hf = write(tmp_path, "node1 slots=2\nnode2 slots=2\n")
    logs = tmp_path / "logs"
    for override, needle in [("parallel.tp=3", "multiple of tp x pp = 3"), ("parallel.dp=8", "set parallel.dp=4"),
                             ("training.global_batch=6", "multiple of 4"),
                             # the launcher asks the same Layout rules as validation, not only the world size
                             ("parallel.tp=4", "model.num_query_groups=2 is not divisible by parallel.tp=4")]:
        r = run_launch("train.sh", TOY, "--hostfile", hf, "--backend", "deepspeed", "--log-dir", logs, "--", override)
        assert r.returncode == 3, r.stderr
        assert "Fix:" in r.stderr and needle in r.stderr, r.stderr
        assert not logs.exists()
    r = run_launch("preflight.sh", TOY, "--hostfile", hf, "--backend", "torchrun-ssh", "--", "parallel.pp=3")
    assert r.returncode == 3 and "tp x pp = 3" in r.stderr
