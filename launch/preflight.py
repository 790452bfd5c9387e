"""`launch/preflight.sh` (python -m launch preflight): check a cluster before committing it to a run, and start
nothing (except the optional communication check): hostfile syntax and selection, world size vs the recipe's
TP x PP x DP, ssh to every node, the repo and venv on it, GPUs vs slots (nvidia-smi), a writable checkpoint dir shared
by all nodes, the data paths visible everywhere (launch/node_check.sh on each node), and with --comm-check an
all-reduce bandwidth test across all ranks (launch/commcheck.py, started like a training run). The recipe is checked
for the world it would start as train.sh checks it (launch/recipe_check.py: layout, memory, data, train length,
checkpoint dir). Under Slurm without a hostfile the nodes are only known when the job starts: no node is checked."""
from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
from pathlib import Path

from launch import recipe_check
from launch.common import LAUNCH_DIR, REPO_DIR, LaunchError, python, say
from launch.options import Options
from launch.ssh import Ssh
from launch.train import checked_plan


def node_command(slots: int, facts: recipe_check.Facts, marker: str) -> str:
    words = [str(slots), facts.device, facts.checkpoint_dir, marker, *facts.data_paths]
    return (f"test -x {shlex.quote(python())} && test -d {shlex.quote(str(REPO_DIR / 'recipes'))} && echo repo=ok; "
            f"bash {shlex.quote(str(LAUNCH_DIR / 'node_check.sh'))} " + " ".join(shlex.quote(w) for w in words))


def problems(host: str, slots: int, out: str, facts: recipe_check.Facts) -> list[str]:
    """What node_check.sh's `key=value` lines say is wrong on one node, each with its fix."""
    kv = [line.partition("=") for line in out.splitlines()]
    got = {k: v for k, _, v in kv}
    if "host" not in got:
        return [f"unreachable over ssh: {out[:300].replace(chr(10), ' ')} -- fix: passwordless ssh to {host} (try: "
                f"ssh {host} true)"]
    found = []
    if got.get("repo") != "ok":
        found.append(f"no repo/venv at {REPO_DIR} -- fix: the same checkout + launch/setup_env.sh on every node (or a "
                     "shared filesystem)")
    gpus = got.get("gpus", "none")
    if gpus == "none" and facts.device != "cpu":
        found.append(f"no nvidia-smi but the recipe runs on {facts.device} -- fix: install the NVIDIA driver, or "
                     "cluster.device=cpu for a CPU run")
    elif gpus.isdigit() and int(gpus) < slots:
        found.append(f"{gpus} GPU(s) but slots={slots} -- fix: '{host} slots={gpus}' in the hostfile, or --num-gpus "
                     f"{gpus}")
    if facts.checkpoint_dir:
        if got.get("ckpt_writable") != "yes":
            found.append(f"checkpoint.dir {facts.checkpoint_dir} is not writable -- fix: create it or its permissions")
        if got.get("ckpt_shared") != "yes":
            found.append(f"checkpoint.dir {facts.checkpoint_dir} is not the directory this host sees -- fix: a "
                         "filesystem every node mounts")
    found += [f"data path {v.split(' ', 1)[1]} is not visible -- fix: a shared filesystem, or copy the data to every "
              "node" for k, _, v in kv if k == "data_visible" and v.startswith("no ")]
    return found


def _marker(ckpt: str) -> str:
    marker = f".preflight-shared-{os.getpid()}-{os.urandom(4).hex()}"
    if ckpt:
        try:
            Path(ckpt).mkdir(parents=True, exist_ok=True)
            (Path(ckpt) / marker).touch(exist_ok=False)
        except OSError:
            raise LaunchError(f"checkpoint.dir {ckpt} is not writable from this host; fix the path or its "
                              "permissions", 4) from None
    return marker


def check_nodes(opts: Options, ssh: Ssh, nodes, facts) -> bool:
    marker = _marker(facts.checkpoint_dir)
    try:
        if opts.backend == "local":
            outs = {n.host: subprocess.run(["bash", "-c", node_command(n.slots, facts, marker)], capture_output=True,
                                           text=True, stdin=subprocess.DEVNULL) for n in nodes.nodes}
        else:
            slots = {n.host: n.slots for n in nodes.nodes}
            outs = ssh.run_all(nodes.hosts, lambda h: node_command(slots[h], facts, marker))
    finally:
        if facts.checkpoint_dir:
            (Path(facts.checkpoint_dir) / marker).unlink(missing_ok=True)
    ok = True
    for n in nodes.nodes:
        r = outs[n.host]
        found = problems(n.host, n.slots, r.stdout + r.stderr, facts)
        gpus = next((line[5:] for line in r.stdout.splitlines() if line.startswith("gpus=")), "?")
        for p in found or [f"ok (slots={n.slots}, gpus={gpus})"]:
            say(f"node {n.host}: {p}")
        ok &= not found
    return ok


def preflight(opts: Options) -> int:
    ssh = Ssh()
    nodes, facts, _ = checked_plan(opts, ssh)
    what = "Slurm" if nodes.slurm_picks else "hostfile" if opts.hostfile else "this machine"
    say(f"{what}: {len(nodes.nodes)} node(s), world size {nodes.world_size} -> {facts.layout}")
    for note in facts.notes:
        say(note)
    if nodes.slurm_picks:
        say("the nodes are chosen by Slurm when the job starts: no node is checked here (the recipe is ready)")
        return 0
    if not check_nodes(opts, ssh, nodes, facts):
        raise LaunchError("preflight failed: fix the nodes above before launching", 4)
    say(f"preflight ok: {len(nodes.nodes)} node(s), world size {nodes.world_size}")
    if not opts.comm_check:
        return 0
    say(f"communication check: all-reduce across all {nodes.world_size} ranks")
    from launch.train import train

    return train(dataclasses.replace(opts, entry="python -m launch.commcheck", no_preflight=True, comm_check=False))
