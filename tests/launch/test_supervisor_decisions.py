"""The supervisor's decisions as plain functions, without processes: restart or not, which spare, the back-off, which
rank failed (from exit records, not from output), the hang verdict's blame, and what each back end renders."""
from __future__ import annotations

import base64
import json
import shlex
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from launch import failures, supervise, watchdog
from launch.backends import make
from launch.backends.base import Launch
from launch.backends.deepspeed import world_info
from launch.backends.local import shell_line
from launch.backends.slurm import script
from launch.hostfile import Node, valid_host
from launch.plan import NodePlan
from launch.ssh import Ssh

pytestmark = pytest.mark.unit


def nodes(*spec):
    return [Node(h, s) for h, s in spec]


# --- restart or not, which spare, how long ---------------------------------------------------------------------

def test_backoff_doubles_from_the_base_up_to_the_cap():
    assert [supervise.backoff_seconds(10, 300, k) for k in range(1, 8)] == [10, 20, 40, 80, 160, 300, 300]
    assert supervise.backoff_seconds(0.5, 300, 1) == 0.5


def test_restarts_run_out_with_the_reason_and_none_allowed_says_nothing():
    f = supervise.Failure("exit code 137", 137, 1, "n1")
    d = supervise.decide(f, restarts=2, max_restarts=2, host_failures=Counter(), nodes=nodes(("n1", 2)), spares=[],
                         spares_n=0)
    assert not d.restart
    assert d.message == ("FAILED: no restarts left: 2 of 2 used (--max-restarts / supervision.max_restarts); last "
                         "failure: exit code 137. The run stops.")
    d = supervise.decide(f, 0, 0, Counter(), nodes(("n1", 2)), [], 0)
    assert (d.restart, d.message) == (False, "")
    assert supervise.decide(f, 0, 3, Counter({"n1": 5}), nodes(("n1", 2)), [], 0).restart  # no --spares: no rule


def test_a_host_that_failed_twice_is_replaced_by_the_first_answering_spare_with_its_slots():
    world = nodes(("n1", 2), ("n2", 2))
    spares = nodes(("s4", 4), ("s-dead", 2), ("s2", 2), ("s2b", 2))
    f = supervise.Failure("exit code 1", 1, 2, "n2")
    once = supervise.decide(f, 0, 5, Counter({"n2": 1}), world, spares, 4, reachable=lambda h: True)
    assert once.restart and once.replacement is None  # the first failure of a host: the same hosts again
    asked = []
    d = supervise.decide(f, 1, 5, Counter({"n2": 2}), world, spares, 4,
                         reachable=lambda h: asked.append(h) or h != "s-dead")
    assert d.restart and (d.replacement.index, d.replacement.bad, d.replacement.spare.host) == (1, "n2", "s2")
    assert asked == ["s-dead", "s2"]  # a wider spare is never asked; an unreachable one is dropped from the pool
    assert [n.host for n in d.spares_left] == ["s4", "s2b"]


def test_no_spare_left_stops_the_run_naming_the_slots():
    f = supervise.Failure("exit code 1", 1, 0, "n1")
    d = supervise.decide(f, 3, 5, Counter({"n1": 2}), nodes(("n1", 8), ("n2", 8)), nodes(("s", 4)), 1)
    assert not d.restart
    assert d.message == ("FAILED: host n1 failed twice and no spare with slots=8 is left (--spares 1); the run stops "
                         "after 3 restart(s).")
    # a host outside the world (a rank that ran on a spare's old name, the launcher's own host): restart as is
    g = supervise.Failure("exit code 1", 1, 0, "elsewhere")
    assert supervise.decide(g, 0, 5, Counter({"elsewhere": 2}), nodes(("n1", 8)), [], 1).restart


def test_restart_record_counts_the_steps_lost():
    f = supervise.from_hang({"behind": [1], "culprit_host": "n2", "timeout_s": 15.0})
    assert (f.why, f.rank, f.host, f.exit_code) == ("hang (no rank advanced for 15 s)", 1, "n2", None)
    rec = supervise.restart_record(2, 3, f, resumed=4, last=7, backoff_s=20, failed_at=0.0, replaced="n2>n3",
                                   hosts=["n1", "n3"])
    assert (rec["steps_lost"], rec["rank"], rec["replaced"], rec["hosts"]) == (3, 1, "n2>n3", "n1 n3")
    several = supervise.from_hang({"behind": [0, 1], "culprit_host": None, "timeout_s": 9.0})
    assert (several.rank, several.host) == ("0,1", None)
    assert supervise.from_node("deepspeed-runner", 1).host is None and supervise.from_node("n2", 255).host == "n2"


# --- which rank failed: exit records, never output ---------------------------------------------------------------

def test_the_first_rank_that_died_on_its_own_is_the_failure():
    recs = [failures.parse_record(t) for t in (
        "rank=0 exit=143 stopped=0 at=100.5 host=n1",     # SIGTERM from torchrun: stopped because of another
        "rank=3 exit=1 stopped=1 at=99.0 host=n2",        # signalled by us first: not a cause
        "rank=2 exit=137 stopped=0 at=100.2 host=n2",
        "rank=1 exit=1 stopped=0 at=100.3 host=n1",
        "rank=4 exit=0 stopped=0 at=98.0 host=n3")]
    first = failures.first_failure(recs)
    assert (first.rank, first.host, first.exit_code) == (2, "n2", 137)
    assert first.describe() == "rank 2 on host n2 exited with code 137 (killed by signal 9)"
    assert failures.first_failure(recs[:1] + recs[-1:]) is None


def test_a_killed_rank_is_the_cause_of_its_peers_exits_recorded_just_before_it():
    """A peer's exit 1 (its collective broke) recorded before the killed rank's own record: the killed rank is named;
    seconds apart, or an abort (a runtime's reaction to a peer), the earliest record is."""
    recs = lambda *texts: [failures.parse_record(t) for t in texts]  # noqa: E731
    peer, killed = "rank=2 exit=1 stopped=0 at=100.0 host=n2", "rank=1 exit=137 stopped=0 at=100.4 host=n1"
    assert failures.first_failure(recs(peer, killed)).rank == 1
    assert failures.first_failure(recs(peer, "rank=1 exit=139 stopped=0 at=104.9 host=n1")).rank == 1  # a segfault
    assert failures.first_failure(recs(peer, "rank=1 exit=137 stopped=0 at=105.1 host=n1")).rank == 2  # too late
    assert failures.first_failure(recs(peer, "rank=1 exit=134 stopped=0 at=100.4 host=n1")).rank == 2  # an abort


@pytest.mark.parametrize("text", [
    "LAUNCH-FAIL rank=0 host=n1 exit=1 at=1.0 cmd=x",             # the old log line: not a record
    "[n1 rank 0] rank=0 exit=1 stopped=0 at=1.0 host=n1",          # a rank's output, prefixed
    "rank=0 exit=1 stopped=0 at=1.0 host=n1 extra=1",
    "rank=x exit=1 stopped=0 at=1.0 host=n1"])
def test_only_a_whole_record_line_is_a_record(text):
    assert failures.parse_record(text) is None


def test_a_record_host_that_breaks_the_host_rule_is_not_trusted(tmp_path):
    rec = failures.parse_record("rank=0 exit=1 stopped=0 at=1.0 host=-oProxyCommand=x")
    assert rec is not None and rec.host is None and rec.describe().startswith("rank 0 on host ?")
    assert not valid_host("a b") and not valid_host("-oX") and not valid_host("$(x)") and valid_host("gpu-01.c[3]")


def test_exit_watch_reads_each_record_once(tmp_path, monkeypatch):
    w = failures.ExitWatch(tmp_path)
    assert w.poll() == [] and w.first_failure() is None
    (tmp_path / "rank-1.exit").write_text("rank=1 exit=9 stopped=0 at=5.0 host=n1\n")
    (tmp_path / ".rank-2.XXXX").write_text("rank=2 exit=9 stopped=0 at=1.0 host=n1\n")  # not renamed yet: ignored
    assert w.first_failure().rank == 1
    reads = []
    real = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a: reads.append(self.name) or real(self, *a))
    w.poll()
    assert reads == []


def test_the_failed_ranks_last_lines_come_from_its_own_log(tmp_path):
    (tmp_path / "n2.log").write_text("".join(f"[n2 rank {r}] line {k}\n" for k in range(40) for r in (2, 3)))
    rec = failures.parse_record("rank=3 exit=1 stopped=0 at=1.0 host=n2")
    lines = failures.report(rec, tmp_path, " all ranks were stopped (3 s).")
    assert lines[0] == "FAILED: rank 3 on host n2 exited with code 1 first; all ranks were stopped (3 s)."
    assert lines[2:] == [f"    [n2 rank 3] line {k}" for k in range(25, 40)]


# --- heartbeats: checked before use; only the plan's hosts are signalled -----------------------------------------

def test_heartbeats_that_break_a_rule_are_ignored_and_only_plan_hosts_get_signals(tmp_path):
    good = {"rank": 0, "host": "n1", "pid": 10, "step": 3, "phase": "data"}
    bad = [dict(good, rank=1, host="-oProxyCommand=/tmp/x.sh"), dict(good, rank=2, host="n1; touch x"),
           dict(good, rank=3, pid="10 11"), dict(good, rank=4, phase="$(x)"), dict(good, rank=5, step=True)]
    for rec in [good, *bad, dict(good, rank=6, host="stranger", pid=66), dict(good, rank=7, pid=12)]:
        (tmp_path / f"rank-{rec['rank']}.json").write_text(json.dumps(rec))
    beats = watchdog.read_heartbeats(tmp_path)
    assert sorted(beats) == [0, 6, 7]
    assert watchdog.stack_targets(beats, ["n1", "n2"]) == {"n1": [10, 12]}
    assert watchdog.last_step(beats) == 3 and watchdog.last_step({}) is None


def test_ssh_takes_the_host_as_its_own_argument_after_the_options():
    ssh = Ssh({})
    argv = ssh.argv("node1", "echo hi")
    assert argv[-3:] == ["--", "node1", "echo hi"] and "BatchMode=yes" in argv
    # the client dies with the launcher (setpriv, on Linux): no remote command starts after the launcher is gone
    assert argv[:argv.index("ssh")] == [shutil.which("setpriv"), "--pdeathsig", "KILL", "--"]
    with pytest.raises(Exception, match="not a host name"):
        ssh.argv("-oProxyCommand=x", "true")



def test_the_ssh_shim_dir_of_a_killed_launcher_is_removed_by_the_next_launch(tmp_path, monkeypatch):
    """A SIGKILLed launcher leaves its ssh shim's directory in the temp dir; the next launch removes it (its pid is
    gone), and keeps a live launcher's and anything not named like one."""
    import os
    import socket
    import tempfile

    from launch import ssh as ssh_mod

    gone = subprocess.Popen(["true"])
    gone.wait()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    host, ns = socket.gethostname(), ssh_mod._pid_namespace()
    stale = tmp_path / f"launch-ssh.{gone.pid}.{host}.{ns}.x1"
    live = tmp_path / f"launch-ssh.{os.getpid()}.{host}.{ns}.x2"
    other = tmp_path / "launch-ssh.notes"
    elsewhere = tmp_path / f"launch-ssh.{gone.pid}.another-host.{ns}.x3"  # a temp dir shared with another host
    container = tmp_path / f"launch-ssh.{gone.pid}.{host}.4026531999.x4"  # another pid namespace: its pid is not ours
    superscript = tmp_path / "launch-ssh.\u00b2.x5"  # '²'.isdigit() is True; int('²') raised
    for d in (stale, live, other, elsewhere, container, superscript):
        d.mkdir()
        (d / "ssh").write_text("#!/bin/sh\n")
    config = tmp_path / "ssh_config"
    config.write_text("Host node1\n")
    ssh = Ssh({"LAUNCH_SSH_CONFIG": str(config)})
    shim = Path(ssh.tool_env()["PATH"].split(":")[0])
    assert not stale.exists() and live.exists() and other.exists() and elsewhere.exists()
    assert container.exists() and superscript.exists()
    assert shim.parent == tmp_path and shim.name.startswith(f"launch-ssh.{os.getpid()}.{host}.")
    assert f"-F {config}" in (shim / "ssh").read_text()
    ssh.close()
    assert not shim.exists()
    ssh_mod._remove_stale_shims(str(tmp_path))  # a live pid is never taken for a dead one
    assert live.exists()

# --- rendering: the back ends from data ------------------------------------------------------------------------

def _launch(tmp_path, backend_nodes=(("n1", 2), ("n2", 2)), **kw) -> Launch:
    plan = NodePlan([Node(h, s) for h, s in backend_nodes], "10.0.0.1")
    args = dict(run_id="r1", log_dir=tmp_path, plan=plan, master_port=29500,
                env_lines=["PATH=/v/bin:/usr/bin", "LAUNCH_RUN_ID=r1", "NCCL_X=a b"],
                rank_cmd=["/repo/launch/rank_exec.sh", "/v/bin/python", "-m", "recipes", "train", "--config",
                          "/r.yaml", "name=it's $(touch x)"], secret_names=["HF_TOKEN"], repo="/repo", venv="/v",
                python="/v/bin/python", layout="TP=1 x PP=1 x DP=4", attempt=2, attempt_dir=tmp_path / "attempt-2")
    args.update(kw)
    return Launch(**args)


def test_local_and_ssh_render_the_same_node_command(tmp_path):
    launch = _launch(tmp_path)
    line = shell_line(launch, 1)
    words = shlex.split(line.split(" && ", 1)[1])
    assert words[:2] == ["exec", "env"] and "NCCL_X=a b" in words and "LAUNCH_HOST=n2" in words
    assert f"LAUNCH_EXIT_DIR={tmp_path}/attempt-2/exits" in words and "LAUNCH_ATTEMPT=2" in words
    assert words[-1] == "name=it's $(touch x)" and "--node_rank=1" in words and "--master_addr=10.0.0.1" in words
    (spawn,) = make("local").spawns(_launch(tmp_path, (("localhost", 2),)))
    assert spawn.env["LAUNCH_HOST"] == "localhost" and spawn.argv[-1] == "name=it's $(touch x)" and spawn.cwd == "/repo"
    ssh_spawns = make("torchrun-ssh", Ssh({})).spawns(launch)
    assert [s.argv[-2:] for s in ssh_spawns] == [["n1", shell_line(launch, 0)], ["n2", line]]


def test_deepspeed_renders_its_env_file_hostfile_and_world_info(tmp_path):
    launch = _launch(tmp_path, (("n1", 2), ("n2", 3)), env_lines=["A=x\"$`\\y", "B=plain"])
    launch.nodes[1].devices = [0, 2, 3]
    files = make("deepspeed").files(launch)
    env = dict(line.split("=", 1) for line in files["ds.env"].splitlines())

    def on_the_node(escaped):  # what DeepSpeed's runner pastes: export NAME="VALUE" (a shell reads it on each node)
        return subprocess.run(["bash", "-c", f'export X="{escaped}"; printf %s "$X"'], capture_output=True,
                              text=True).stdout

    assert on_the_node(env["A"]) == 'x"$`\\y' and env["B"] == "plain" and env["LAUNCH_HOSTS"] == "n1 n2"
    assert shlex.split(on_the_node(env["LAUNCH_RANK_CMD"])) == launch.rank_cmd[1:]
    assert env["LAUNCH_EXIT_DIR"] == f"{tmp_path}/attempt-2/exits"
    assert files["hostfile"] == "n1 slots=2\nn2 slots=3\n"
    assert json.loads(base64.urlsafe_b64decode(world_info(launch))) == {"n1": [0, 1], "n2": [0, 2, 3]}
    (spawn,) = make("deepspeed", Ssh({})).spawns(launch)
    assert spawn.own_session and spawn.demux_hosts == ("n1", "n2") and "HF_TOKEN" not in spawn.env
    assert "--include" in spawn.argv and spawn.argv[spawn.argv.index("--include") + 1] == "n1:0,1@n2:0,2,3"


def test_slurm_script_is_valid_bash_and_quotes_every_value(tmp_path):
    launch = _launch(tmp_path, log_dir=tmp_path / "run logs", master_addr_opt="head node", device="cuda")
    text = script(launch)
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    assert "#SBATCH --gpus-per-node=2\n" in text and "export NCCL_X='a b'\n" in text
    assert "export MASTER_ADDR=${MASTER_ADDR:-'head node'}" in text
    assert "'name=it'\"'\"'s $(touch x)'" in text  # the override, one quoted word
