"""Elastic training (`launch/train.sh --min-nodes N`, launch/elastic.py): a node gone for good, no spare left: the run
goes on with the nodes that answer, the model split and the global batch kept, DP lowered, the checkpoint resharded
on load; the restart record and metrics.jsonl say what changed. Real processes: two loopback sshd "nodes", the real
trainer, a rank killed on node2 after a checkpoint, node2 unreachable from then on (its ssh config sends it nowhere
once the kill's mark file exists)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from launch import elastic
from launch.common import LaunchError
from launch.hostfile import Node
from tests.support.launch import REPO, free_port, launch_env, run_launch
from tests.support.runs import losses, metrics, pretrain

RECIPE = REPO / "configs" / "runs" / "tiny-cpu.yaml"
STEPS = 8


@pytest.mark.unit
def test_the_world_is_the_nodes_that_answer_and_dp_takes_the_change():
    nodes = [Node("n1", 8), Node("n2", 8), Node("n3", 8), Node("n4", 8)]
    assert [n.host for n in elastic.surviving(nodes, lambda h: h != "n3")] == ["n1", "n2", "n4"]

    class Split:
        tp, cp, pp = 2, 1, 4

    assert elastic.world_overrides(Split, nodes[:2]) == (["cluster.nodes=2", "parallel.dp=2"], 2)
    with pytest.raises(LaunchError, match="2 node\\(s\\) with 12 ranks do not hold whole model replicas of TP x CP x "
                                          "PP = 2 x 1 x 4 = 8"):
        elastic.world_overrides(Split, [Node("n1", 8), Node("n2", 4)])


@pytest.mark.ssh
@pytest.mark.timeout(900)
def test_a_node_gone_for_good_shrinks_the_run_which_finishes_with_the_same_global_batch(tmp_path):
    from tests.support.corpus import write_corpus
    from tests.support.loopback_ssh import loopback_sshd

    corpus = write_corpus(tmp_path / "corpus", max_bytes=200_000)
    data = [f"data.manifests=[{corpus}]", f"training.train_steps={STEPS}", "training.log_interval=1"]
    reference = tmp_path / "reference"
    pretrain(4, *data, f"checkpoint.dir={reference}", timeout=600)  # DP=4 throughout, the same token budget
    down = tmp_path / "node2.down"
    run = tmp_path / "run"
    with loopback_sshd(str(tmp_path / "sshd"), {"node1": "127.0.0.1", "node2": "127.0.0.2"}) as config:
        text = Path(config).read_text()  # once the mark exists, node2 is an address nothing listens on
        Path(config).write_text(f'Match host node2 exec "test -e {down}"\n  HostName 127.0.0.254\n\n{text}')
        hostfile = tmp_path / "hostfile"
        hostfile.write_text("node1 slots=2\nnode2 slots=2\n")
        env = launch_env(LAUNCH_SSH_CONFIG=config, PYTHONPATH=str(REPO),
                         RECIPES_TEST_FAULT=f"kill rank=2 step=5 host=node2 attempt=1 touch={down}")
        r = run_launch("train.sh", RECIPE, "--hostfile", hostfile, "--backend", "torchrun-ssh", "--min-nodes", 1,
                       "--max-restarts", 2, "--env", "RECIPES_TEST_FAULT,PYTHONPATH", "--master-port", free_port(),
                       "--log-dir", tmp_path / "logs", "--quiet", "--", *data, f"checkpoint.dir={run}",
                       "checkpoint.save_interval=4", "checkpoint.async_save=false",
                       "supervision.restart_backoff_seconds=0.5", env=env, timeout=800)
    assert r.returncode == 0, r.stderr[-5000:]
    assert "elastic: the world becomes node1 (2 ranks" in r.stderr, r.stderr[-3000:]
    [rec] = [json.loads(x) for x in (tmp_path / "logs" / "restarts.jsonl").read_text().splitlines()]
    resized = rec["resized"]
    assert resized["why"] == "gone: node2" and resized["dp"] == 2 and resized["nodes"] == 1
    assert "DP=4" in resized["from"] and "DP=2" in resized["to"]
    assert resized["global_batch"] == 8 and resized["tokens_per_step"] == 8 * 64
    assert rec["resumed_from_step"] == 4
    starts = [m for m in metrics(run) if "layout" in m]
    assert [(m["step"], m["world_size"], m["micro_batches_per_step"]) for m in starts] == [(0, 4, 2), (4, 2, 4)]
    got, ref = losses(run), losses(reference)
    assert sorted(got) == list(range(1, STEPS + 1))
    worst = max(abs(got[s] - ref[s]) / ref[s] for s in range(5, STEPS + 1))
    assert worst <= 1e-5, (got, ref, worst)
