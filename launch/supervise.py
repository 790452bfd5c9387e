"""The supervisor of a run: attempts, and between them the restart decision, spares, back-off and the restart record.

An attempt starts what the back end rendered and watches three things every half second: the node processes'
exits, the ranks' exit records (launch/failures.py) and, with supervision.hang_timeout_seconds, the heartbeats
(launch/watchdog.py). The first failure stops every rank on every node. Then plain functions decide, from data alone:
which failure it was (`attribute`), whether to restart and on which hosts (`decide`, `pick_spare`), how long to wait
(`backoff_seconds`), and what to record (`restart_record`). A stop requested with launch/stop.sh is never restarted.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from launch import elastic, failures, run_files, watchdog
from launch.backends.base import Backend, Launch
from launch.common import Interrupted, LaunchError, remote_launch, say
from launch.hostfile import Node
from launch.procs import NodeProcess
from launch.ssh import Ssh, check_reachable, push_private_file
from launch.stop import signal_local, stop_hosts, stop_local

POLL_S = 0.5


# --- decisions: plain functions of data, no processes ------------------------------------------------------------

@dataclass
class Failure:
    why: str                          # "exit code 137", "hang (no rank advanced for 900 s)", "node command exit 1"
    exit_code: int | None = None
    rank: int | str | None = None     # one rank, or "0,1" when several are behind in a hang
    host: str | None = None           # the host to blame (the spare rule); None when no single host is


def from_record(rec: failures.ExitRecord) -> Failure:
    return Failure(f"exit code {rec.exit_code}", rec.exit_code, rec.rank, rec.host)


def from_node(name: str, rc: int) -> Failure:
    return Failure(f"node command exit {rc}", rc, None, None if name == "deepspeed-runner" else name)


def from_hang(v: dict) -> Failure:
    ranks = v["behind"]
    rank = ranks[0] if len(ranks) == 1 else ",".join(map(str, ranks)) or None
    return Failure(f"hang (no rank advanced for {v['timeout_s']:g} s)", None, rank, v["culprit_host"])


def backoff_seconds(base: float, cap: float, k: int) -> float:
    """Before restart k (1, 2, ...): base * 2^(k-1), at most cap."""
    return min(base * 2 ** (k - 1), cap)


@dataclass
class Replacement:
    index: int                        # the node replaced, in node order
    bad: str
    spare: Node


def pick_spare(bad: str, nodes: list[Node], spares: list[Node], reachable: Callable[[str], bool]
               ) -> tuple[Replacement | None, list[Node]]:
    """The first spare with the bad host's slots that answers (`reachable`); unreachable spares leave the pool.
    Returns (the replacement or None, the spares left)."""
    i = next(k for k, n in enumerate(nodes) if n.host == bad)
    left = list(spares)
    for spare in spares:
        if spare.slots != nodes[i].slots:
            continue
        left.remove(spare)
        if reachable(spare.host):
            return Replacement(i, bad, spare), left
    return None, left


@dataclass
class Decision:
    restart: bool
    message: str = ""                 # why the run stops, when it does
    replacement: Replacement | None = None
    spares_left: list[Node] | None = None


def decide(failure: Failure, restarts: int, max_restarts: int, host_failures: Counter, nodes: list[Node],
           spares: list[Node], spares_n: int, reachable: Callable[[str], bool] = lambda h: True) -> Decision:
    """Restart or not, and on which hosts. `host_failures` already counts this failure."""
    if restarts >= max_restarts:
        return Decision(False, "" if max_restarts == 0 else
                        f"FAILED: no restarts left: {restarts} of {max_restarts} used (--max-restarts / "
                        f"supervision.max_restarts); last failure: {failure.why}. The run stops.")
    bad = failure.host
    if not (bad and spares_n > 0 and host_failures[bad] >= 2 and bad in [n.host for n in nodes]):
        return Decision(True)
    rep, left = pick_spare(bad, nodes, spares, reachable)
    if rep is None:
        slots = next(n.slots for n in nodes if n.host == bad)
        return Decision(False, f"FAILED: host {bad} failed twice and no spare with slots={slots} is left "
                               f"(--spares {spares_n}); the run stops after {restarts} restart(s).", None, left)
    return Decision(True, "", rep, left)


def restart_record(restart: int, attempt: int, failure: Failure, resumed: int, last: int | None, backoff_s: float,
                   failed_at: float, replaced: str | None, hosts: list[str]) -> dict:
    """One line of restarts.jsonl."""
    return {"time": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "restart": restart,
            "attempt": attempt, "why": failure.why, "exit_code": failure.exit_code, "rank": failure.rank,
            "host": failure.host, "resumed_from_step": resumed, "last_step": last,
            "steps_lost": None if last is None else max(last - resumed, 0), "backoff_s": backoff_s,
            "failed_at": failed_at, "replaced": replaced, "hosts": " ".join(hosts)}


def resume_step(ckpt_dir: str) -> int:
    """The step of the newest complete checkpoint, what the ranks will load (0: none). Imported only here: it
    brings torch."""
    if not ckpt_dir or not Path(ckpt_dir).is_dir():
        return 0
    from recipes.checkpoint.store import newest_complete

    store_log = logging.getLogger("recipes.checkpoint.store")
    level, store_log.level = store_log.level, logging.ERROR  # its notes on skipped partial saves are the run's
    try:
        tag = newest_complete(ckpt_dir)
    finally:
        store_log.setLevel(level)
    return 0 if tag is None else int(json.loads((Path(ckpt_dir) / tag / "complete.json").read_text())["step"])


# --- the attempt loop ----------------------------------------------------------------------------------------------

class Stopped(Exception):
    """launch/stop.sh stopped the run."""


@dataclass
class Policy:
    max_restarts: int
    backoff_s: float
    backoff_max_s: float
    hang_timeout_s: float
    spares_n: int
    stop_grace_s: float
    checkpoint_dir: str
    pick_port: Callable[[], int] | None = None     # a new port for each restart (None: --master-port was given)
    resolve_addr: Callable[[str], str] | None = None   # the master moves with node 0 (None: --master-addr given)
    preflight_spares: bool = True                      # a spare is checked over ssh before it replaces a host
    min_nodes: int | None = None                       # elastic (--min-nodes): go on with the nodes that answer
    resize: Callable[[list[Node]], "elastic.Resize"] | None = None  # the run on other nodes (launch/train.resize)


class Supervisor:
    def __init__(self, launch: Launch, backend: Backend, policy: Policy, ssh: Ssh | None, quiet: bool,
                 secret_file: str | None):
        self.launch, self.backend, self.policy, self.ssh, self.quiet = launch, backend, policy, ssh, quiet
        self.secret_file = secret_file
        self.spares: list[Node] = list(launch.plan.spares)
        self.host_failures: Counter = Counter()
        self.restarts = 0
        self.procs: list[NodeProcess] = []
        self.log_dir = launch.log_dir
        self.world_nodes: list[Node] = list(launch.plan.nodes)  # the first world, in order: nodes that may rejoin
        self.resized: dict | None = None  # the last restart's change of world (launch/elastic.py)

    # signals
    def install_signals(self) -> None:
        def on_signal(signum, frame):
            for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(s, signal.SIG_IGN)  # one stop; a second Ctrl-C must not cut it short
            raise Interrupted()

        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, on_signal)

    def run(self) -> int:
        self.install_signals()
        try:
            return self._attempts()
        except Interrupted:
            say(f"interrupted: stopping run {self.launch.run_id} on all nodes")
            self.stop_everything()
            return 130
        except Stopped:
            return 1

    def _attempts(self) -> int:
        attempt = 1
        while True:
            failure, trigger_at = self.run_attempt(attempt)
            if failure is None:
                after = f" (after {self.restarts} restart(s))" if self.restarts else ""
                say(f"run {self.launch.run_id} finished: all {self.launch.plan.world_size} ranks exited 0{after}")
                return 0
            if not self.between_attempts(failure, trigger_at):
                return 1
            attempt += 1

    def run_attempt(self, attempt: int) -> tuple[Failure | None, float]:
        launch = self.launch
        launch.attempt, launch.attempt_dir = attempt, self.log_dir / f"attempt-{attempt}"
        for sub in ("heartbeat", "stacks", "exits"):
            (launch.attempt_dir / sub).mkdir(parents=True)
        if attempt > 1 and self.policy.pick_port:  # a port the old rendezvous may still hold
            launch.master_port = self.policy.pick_port()
        for name, text in self.backend.files(launch).items():
            run_files.write(self.log_dir / name, text, private=False)
        self.attempt_hosts = list(launch.plan.hosts)
        self.procs = [NodeProcess(s, self.log_dir, self.quiet) for s in self.backend.spawns(launch)]
        trigger = self.monitor()
        return (None, 0.0) if trigger is None else (self.after_trigger(trigger), time.time())

    def monitor(self) -> tuple | None:
        """Until every node command ended (None: all fine) or the first trigger: ("node", name, rc), ("rank",),
        ("hang", verdict)."""
        d = self.launch.attempt_dir
        exits = failures.ExitWatch(d / "exits")
        hang = watchdog.HangWatch(self.launch.plan.world_size, self.policy.hang_timeout_s) \
            if self.policy.hang_timeout_s else None
        while True:
            alive, node_failure = False, None
            for p in self.procs:
                rc = p.poll()
                alive |= rc is None
                if rc not in (None, 0) and node_failure is None:
                    node_failure = ("node", p.name, rc)
            if node_failure:
                return node_failure
            if exits.first_failure():
                return ("rank",)
            v = hang.observe(watchdog.read_heartbeats(d / "heartbeat"), time.monotonic()) if hang else None
            if v:
                return ("hang", v)
            if not alive:
                return None
            time.sleep(POLL_S)

    def after_trigger(self, trigger: tuple) -> Failure:
        """Stop every rank, then name the failure (or end the run: a requested stop)."""
        requested = (self.log_dir / "stop_requested").exists()  # stop.sh writes it before it stops anything
        failure = None
        if trigger[0] == "hang":
            failure = self.handle_hang(trigger[1])
        if requested:
            say(f"stopping run {self.launch.run_id} on all {len(self.attempt_hosts)} node(s) (launch/stop.sh was "
                "called)")
        else:
            say(f"{failure.why if failure else 'a rank failed'}: stopping run {self.launch.run_id} on all "
                f"{len(self.attempt_hosts)} node(s)")
        seconds = self.stop_nodes()
        if requested:
            say(f"STOPPED: run {self.launch.run_id} was stopped on request (launch/stop.sh); every rank on every "
                "node is gone.")
            raise Stopped()
        return failure or self.attribute(trigger, seconds)

    def handle_hang(self, v: dict) -> Failure:
        d = self.launch.attempt_dir
        watchdog.write_verdict(d / "hang.json", v)
        say(f"no rank advanced for {v['timeout_s']:g} s: dumping every rank's stack into {d / 'stacks'}/")
        for line in v["report"]:
            say(line)
        self.dump_stacks()
        return from_hang(v)

    def attribute(self, trigger: tuple, stop_seconds: int) -> Failure:
        rec = failures.ExitWatch(self.launch.attempt_dir / "exits").first_failure()
        if rec is not None:
            for line in failures.report(rec, self.log_dir, f" all ranks were stopped ({stop_seconds} s)."):
                say(line)
            return from_record(rec)
        if trigger[0] != "node":  # a record seen earlier that vanished since: say so rather than guess
            say(f"FAILED: a rank failed, but its exit record is gone; all ranks were stopped. See {self.log_dir}/.")
            return Failure("a rank failed")
        name, rc = trigger[1], trigger[2]
        say(f"FAILED: node {name} (exit {rc}) before any rank reported; all ranks were stopped. See {self.log_dir}/.")
        log = self.log_dir / f"{name}.log"
        if log.exists():
            for line in log.read_bytes()[-8192:].decode(errors="replace").splitlines()[-15:]:
                say(f"    {line}")
        return from_node(name, rc)

    # stopping
    def stop_everything(self) -> None:
        """Every process of the run on every node, by run id; what the nodes say goes to launcher.log."""
        launch, grace = self.launch, self.policy.stop_grace_s
        if self.backend.name == "local":
            text = stop_local(launch.run_id, grace) + "\n"
        else:
            text = stop_hosts(self.ssh, launch.plan.hosts, launch.run_id, grace)[1]
        with open(self.log_dir / "launcher.log", "a") as f:
            f.write(text)

    def stop_nodes(self) -> int:
        t0 = time.monotonic()
        self.stop_everything()
        deadline = time.monotonic() + self.policy.stop_grace_s + 20
        for p in self.procs:
            p.finish(deadline)
        return round(time.monotonic() - t0)

    def dump_stacks(self) -> None:
        """SIGUSR2 to every rank that wrote a heartbeat, on its own node (faulthandler writes its stack); only hosts
        of this plan, only processes carrying this run's id (checked on the node)."""
        beats = watchdog.read_heartbeats(self.launch.attempt_dir / "heartbeat")
        targets = watchdog.stack_targets(beats, self.attempt_hosts)
        run_id = self.launch.run_id
        if self.backend.name == "local":
            text = "".join(line + "\n" for pids in targets.values() for line in
                           signal_local("USR2", run_id, [str(p) for p in pids]))
        else:
            results = self.ssh.run_all(list(targets), lambda h: remote_launch(
                "stop", "--signal-local", "USR2", run_id, *map(str, targets[h])))
            text = "".join(r.stdout + r.stderr for r in results.values())
        with open(self.log_dir / "launcher.log", "a") as f:
            f.write(text)
        time.sleep(1)  # faulthandler writes at once; give a shared file system a moment before the ranks are stopped

    # between attempts
    def between_attempts(self, failure: Failure, failed_at: float) -> bool:
        if failure.host:
            self.host_failures[failure.host] += 1
        p = self.policy
        d = decide(failure, self.restarts, p.max_restarts, self.host_failures, self.launch.plan.nodes, self.spares,
                   p.spares_n, self.spare_reachable)
        if d.spares_left is not None:
            self.spares = d.spares_left
        if not d.restart:
            if d.message:
                say(d.message)
            return False
        replaced = self.replace(d.replacement) if d.replacement else None
        if p.resize is not None and not self.resize_world():
            return False
        self.restarts += 1
        return self.restart(failure, failed_at, replaced)

    def resize_world(self) -> bool:
        """Elastic (--min-nodes): the next attempt runs on the run's nodes that answer (False: too few, or the
        recipe cannot run on them; said). Unchanged when they are the current ones."""
        plan, launch = self.launch.plan, self.launch
        self.resized = None
        alive = elastic.surviving(self.world_nodes, lambda h: check_reachable(self.ssh, [h]))
        if [n.host for n in alive] == plan.hosts:
            return True
        if len(alive) < self.policy.min_nodes:
            say(f"FAILED: {len(alive)} of the run's {len(self.world_nodes)} node(s) answer, fewer than --min-nodes "
                f"{self.policy.min_nodes}; the run stops after {self.restarts} restart(s).")
            return False
        try:
            new = self.policy.resize(alive)
        except LaunchError as e:
            say(f"FAILED: the run cannot go on with the {len(alive)} node(s) that answer "
                f"({' '.join(n.host for n in alive)}): {e}")
            return False
        back = [n.host for n in alive if n.host not in plan.hosts]
        if back and self.secret_file and not push_private_file(self.ssh, back, self.secret_file):
            say(f"FAILED: could not copy the env file to returning node(s) {' '.join(back)}")
            return False
        self.resized = elastic.describe(launch.layout, new, plan.hosts, *self.batch_facts())
        say(f"elastic: the world becomes {' '.join(n.host for n in alive)} ({sum(n.slots for n in alive)} ranks, "
            f"{new.layout}; {self.resized['why']}); the global batch stays, the checkpoint is resharded on load")
        plan.nodes[:] = alive
        launch.rank_cmd, launch.layout = new.rank_cmd, new.layout
        run_files.write(self.log_dir / "hosts", "".join(h + "\n" for h in plan.hosts), private=False)
        if self.policy.resolve_addr:
            plan.master_addr = self.policy.resolve_addr(plan.hosts[0])
        return True

    def batch_facts(self) -> tuple[int, int]:
        """(global batch, sequence length) as the ranks' command sets them, for the restart record."""
        from recipes.config.loading import load_recipe

        cmd = self.launch.rank_cmd
        if "--config" not in cmd:
            return 0, 0
        i = cmd.index("--config")
        recipe = load_recipe(cmd[i + 1], cmd[i + 2:])
        return recipe.training.global_batch, recipe.model.seq_length

    def spare_reachable(self, host: str) -> bool:
        return not self.policy.preflight_spares or check_reachable(self.ssh, [host])

    def replace(self, rep: Replacement) -> str:
        """A host that failed twice makes way for a spare with the same slots: the world and the layout stay."""
        plan = self.launch.plan
        say(f"host {rep.bad} failed twice: replaced by spare {rep.spare.host} (slots={rep.spare.slots}); the world "
            f"stays {plan.world_size} ranks")
        plan.nodes[rep.index] = rep.spare
        run_files.write(self.log_dir / "hosts", "".join(h + "\n" for h in plan.hosts), private=False)
        if rep.index == 0 and self.policy.resolve_addr:
            plan.master_addr = self.policy.resolve_addr(plan.hosts[0])
        if self.secret_file and not push_private_file(self.ssh, [rep.spare.host], self.secret_file):
            raise LaunchError(f"could not copy the env file to spare {rep.spare.host}; the run stops after "
                              f"{self.restarts} restart(s)")
        return f"{rep.bad}>{rep.spare.host}"

    def restart(self, failure: Failure, failed_at: float, replaced: str | None) -> bool:
        launch, p, k = self.launch, self.policy, self.restarts
        for h in self.attempt_hosts:  # this attempt's logs go to its dir: the next attempt starts clean ones
            if (self.log_dir / f"{h}.log").exists():
                os.replace(self.log_dir / f"{h}.log", launch.attempt_dir / f"{h}.log")
        last = watchdog.last_step(watchdog.read_heartbeats(launch.attempt_dir / "heartbeat"))
        wait_s = backoff_seconds(p.backoff_s, p.backoff_max_s, k)
        who = f" (rank {failure.rank}" if failure.rank is not None else ""
        who += (f" on host {failure.host}" if failure.host else "") + (")" if failure.rank is not None else "")
        say(f"restart {k} of {p.max_restarts} in {wait_s:g} s (attempt {launch.attempt + 1}): {failure.why}{who}")
        end = time.monotonic() + wait_s
        while time.monotonic() < end and not (self.log_dir / "stop_requested").exists():
            time.sleep(0.2)
        if (self.log_dir / "stop_requested").exists():
            say(f"STOPPED: run {launch.run_id} was stopped on request (launch/stop.sh) before restart {k}.")
            return False
        resumed = resume_step(p.checkpoint_dir)
        rec = restart_record(k, launch.attempt + 1, failure, resumed, last, wait_s, failed_at, replaced,
                             launch.plan.hosts)
        if self.resized:
            rec["resized"] = self.resized
        with open(self.log_dir / "restarts.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")
        start = f"step {resumed} (the newest complete checkpoint)" if resumed else "the start (no complete checkpoint)"
        lost = f", {rec['steps_lost']} step(s) lost," if rec["steps_lost"] is not None else ""
        say(f"restarting run {launch.run_id} from {start}{lost} on {' '.join(launch.plan.hosts)}")
        return True
