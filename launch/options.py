"""The command-line options of `train` and `preflight` (launch/train.sh, launch/preflight.sh): DeepSpeed's hostfile
vocabulary (--hostfile, --include, --exclude, --num-nodes, --num-gpus), Slurm's own (--nodes, --gpus-per-node,
--partition, --account, --time, --qos, --exclusive, --nodelist, --exclude, pyxis's --container-*), the rendezvous,
the run's names, and the recipe overrides after `--`. Options and the recipe may come in any order; every bad value
is one line and exit 2."""
from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field

from launch.common import LaunchError
from launch.slurm_request import SlurmRequest, request

COMMON_USAGE = """
  --hostfile FILE          DeepSpeed-style hostfile: "host slots=N" per line, # comments (default: $LAUNCH_HOSTFILE)
  --backend NAME           deepspeed (default when pdsh exists) | torchrun-ssh | slurm | local
  --include SPEC           hosts/slots to use, DeepSpeed syntax: host1@host2 or host1:0,1@host2
  --exclude SPEC           hosts/slots to leave out (same syntax)
  --num-nodes N            use the first N selected hosts
  --num-gpus N             use N slots per host
  --master-addr ADDR       rendezvous address (default: the first host, as ssh resolves it)
  --master-port PORT       rendezvous port (default: derived from the run id, the first free one on the master)
  --env VAR[,VAR...]       also propagate these variables to every rank (or set LAUNCH_EXPORT="VAR VAR")
  --entry CMD              the per-rank program (default: "python -m recipes train"; python = the venv python)
  --log-dir DIR            where per-node logs go (default runs/launch/RUN_ID); not writable by other users
  --run-id ID              name of this run (default: recipe name + time)
  --comm-check             (preflight) also run the all-reduce bandwidth check across all ranks
  --dry-run                print the plan and the resolved command per node; start nothing
  -- OVERRIDES...          section.key=value recipe overrides, passed to every rank
Slurm (--backend slurm): without a hostfile Slurm picks the nodes and the job learns them from SLURM_JOB_NODELIST
  --nodes N                nodes to allocate (no hostfile)
  --gpus-per-node G        ranks per node (no hostfile; default: the recipe's cluster.gpus_per_node)
  --partition P, --account A, --time T, --qos Q, --exclusive      as sbatch's (--time: 48:00:00, 2-00:00:00, 90)
  --nodelist LIST          run only on these nodes (Slurm syntax gpu[001-004]); a requeue then waits for them
  --exclude LIST           never on these nodes (Slurm syntax; with a hostfile: DeepSpeed's selection, as above)
  --pin-nodes              with a hostfile: run on exactly its hosts (otherwise the hostfile gives the node count
                           and ranks per node, and Slurm picks the nodes, also after a requeue)
  --container-image IMG    run each node's ranks in a pyxis/enroot container (nvcr.io#nvidia/pytorch:25.01-py3, or
                           a .sqsh path); needs the pyxis plugin (srun --help lists --container-image)
  --container-mounts M     SRC:DST[:FLAGS],... (the log dir, recipe, data and checkpoint.dir at the same paths)
  --container-workdir DIR  the repository inside the image (default /opt/llm-recipes, launch/container/Dockerfile)"""

TRAIN_USAGE = f"""usage: launch/train.sh RECIPE [--hostfile FILE | --backend slurm --nodes N] [options] [-- k=v ...]
Check the recipe for the world it will start, then start a training run on the hosts of a hostfile, supervise it,
stop every rank on every node when one dies or the job hangs, and restart it from the newest complete checkpoint
when restarts are allowed; or submit it as a Slurm job (Slurm picks the nodes; the job requeues itself).
examples:
  launch/train.sh configs/runs/my-70b.yaml --hostfile hosts --dry-run
  launch/train.sh configs/runs/my-70b.yaml --backend slurm --nodes 16 --partition gpu --time 48:00:00
  launch/train.sh configs/runs/tiny-cpu.yaml --num-gpus 2 -- data.manifests=[/shared/corpus/manifest.json]
{COMMON_USAGE}
  --no-preflight           skip the ssh/repo reachability check of every node
  --quiet                  write rank output to the logs only, not to the terminal
  --max-restarts N         restart the job from the newest complete checkpoint after a failure or a hang, up to N
                           times (default: the recipe's supervision.max_restarts); not with --backend slurm
  --spares K               keep the last K hosts of the selection out of the world: a host that failed twice is
                           replaced by a spare with the same slots; with none left the run stops
  --min-nodes N            elastic: when a host is gone for good (no ssh) and no spare is left, restart on the hosts
                           that answer, at least N of them: the model split (TP, CP, PP, VPP, EP) and the global
                           batch kept, DP lowered (more micro-batches per step), the checkpoint resharded on load;
                           a host that answers again rejoins at the next restart
environment: LAUNCH_SSH_CONFIG (ssh_config file for aliases/ports/keys), LAUNCH_EXPORT, LAUNCH_STOP_GRACE (s; default: the
  recipe's checkpoint.stop_grace_seconds), LAUNCH_SLURM_GRACE (s, 300: a Slurm job saves and requeues itself this long
  before its time limit), LAUNCH_VENV
exit codes: 0 finished (Slurm: submitted), 1 failed or stopped, 2 bad arguments, hostfile, recipe or data,
  3 the recipe's layout or memory does not fit the world, 4 a node is not ready, 5 another run holds checkpoint.dir,
  130 interrupted"""

PREFLIGHT_USAGE = f"""usage: launch/preflight.sh RECIPE [--hostfile FILE | --backend slurm --nodes N] [options]
Check a cluster before committing it to a run: the recipe for that world, then every node (not under Slurm without
a hostfile: its nodes are chosen when the job starts); start nothing (except the optional communication check).
{COMMON_USAGE}
exit codes: 0 ready, 2 bad hostfile/arguments/recipe/data, 3 the recipe's layout or memory does not fit the world,
  4 a node is not ready"""

BACKENDS = ("deepspeed", "torchrun-ssh", "slurm", "local")
_VALUED = {"--hostfile": "hostfile", "--backend": "backend", "--include": "include", "--exclude": "exclude",
           "--num-nodes": "num_nodes", "--num-gpus": "num_gpus", "--master-addr": "master_addr",
           "--master-port": "master_port", "--env": "env", "--entry": "entry", "--log-dir": "log_dir",
           "--run-id": "run_id", "--nodes": "nodes", "--gpus-per-node": "gpus_per_node", "--partition": "partition",
           "--account": "account", "--time": "time", "--qos": "qos", "--nodelist": "nodelist",
           "--container-image": "image", "--container-mounts": "mounts", "--container-workdir": "workdir"}
_FLAGS = {"--comm-check": "comm_check", "--no-preflight": "no_preflight", "--dry-run": "dry_run",
          "--exclusive": "exclusive", "--pin-nodes": "pin_nodes"}
_SLURM_ONLY = ("--nodes", "--gpus-per-node", "--partition", "--account", "--time", "--qos", "--exclusive",
               "--nodelist", "--pin-nodes", "--container-image", "--container-mounts", "--container-workdir")
_TRAIN_VALUED = {"--max-restarts": "max_restarts", "--spares": "spares", "--min-nodes": "min_nodes"}
_TRAIN_FLAGS = {"--quiet": "quiet"}


@dataclass
class Options:
    recipe: str = ""
    hostfile: str = ""
    backend: str = ""
    include: str = ""
    exclude: str = ""
    num_nodes: int = 0
    num_gpus: int = 0
    nodes: int = 0                   # Slurm without a hostfile: nodes to allocate ...
    gpus_per_node: int = 0           # ... and ranks on each (0: the recipe's cluster.gpus_per_node)
    pin_nodes: bool = False
    exclusive: bool = False
    slurm: SlurmRequest = field(default_factory=SlurmRequest)
    master_addr: str = ""
    master_port: int | None = None
    env_names: list[str] = field(default_factory=list)
    entry: str = "python -m recipes train"
    log_dir: str = ""
    run_id: str = ""
    comm_check: bool = False
    no_preflight: bool = False
    dry_run: bool = False
    quiet: bool = False
    max_restarts: int | None = None
    spares: int = 0
    min_nodes: int | None = None  # elastic: shrink to the nodes left (not below this many), grow when they return
    overrides: list[str] = field(default_factory=list)


class HelpRequested(Exception):
    pass


def parse(argv: list[str], command: str = "train", environ=os.environ) -> Options:
    """train / preflight options; LaunchError(code 2) for a bad one, HelpRequested for -h."""
    valued = dict(_VALUED, **(_TRAIN_VALUED if command == "train" else {}))
    flags = dict(_FLAGS, **(_TRAIN_FLAGS if command == "train" else {}))
    raw: dict[str, str] = {}
    o = Options(hostfile=environ.get("LAUNCH_HOSTFILE", ""))
    env_words = [environ.get("LAUNCH_EXPORT", "")]
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            o.overrides = argv[i + 1:]
            break
        if a in ("-h", "--help"):
            raise HelpRequested()
        if a in flags:
            setattr(o, flags[a], True)
        elif a in valued:
            if i + 1 >= len(argv):
                raise LaunchError(f"{a} needs a value (see --help)", 2)
            i += 1
            if a == "--env":
                env_words.append(argv[i].replace(",", " "))
            else:
                raw[valued[a]] = argv[i]
        elif a.startswith("-"):
            raise LaunchError(f"unknown option '{a}' (see --help)", 2)
        elif o.recipe:
            raise LaunchError(f"two recipes given: '{o.recipe}' and '{a}' (overrides go after --)", 2)
        else:
            o.recipe = a
        i += 1
    o.env_names = " ".join(env_words).split()
    _apply(o, raw, environ)
    _apply_slurm(o, raw, [a for a in argv[:len(argv) - len(o.overrides)] if a in _SLURM_ONLY])
    return o


def _count(raw: dict, key: str, message: str) -> int | None:
    if key not in raw:
        return None
    if not re.fullmatch(r"[0-9]+", raw[key]):
        raise LaunchError(message.format(raw[key]), 2)
    return int(raw[key])


def _apply(o: Options, raw: dict, environ) -> None:
    for key in ("hostfile", "backend", "include", "exclude", "master_addr", "entry", "log_dir", "run_id"):
        if key in raw:
            setattr(o, key, raw[key])
    o.num_nodes = _count(raw, "num_nodes", "--num-nodes '{}': give a number of hosts") or 0
    o.num_gpus = _count(raw, "num_gpus", "--num-gpus '{}': give a number of slots per host") or 0
    for flag, key in (("--num-nodes", "num_nodes"), ("--num-gpus", "num_gpus")):
        if key in raw and int(raw[key]) == 0:  # 0 read as "not given" used to start every host and slot
            raise LaunchError(f"{flag} 0: give at least 1 (or leave {flag} out to use every selected "
                              f"{'host' if key == 'num_nodes' else 'slot'})", 2)
    o.max_restarts = _count(raw, "max_restarts", "--max-restarts '{}': give the number of restarts allowed (0 or more)")
    o.spares = _count(raw, "spares", "--spares '{}': give how many hosts at the end of the selection to keep as "
                                     "spares") or 0
    o.min_nodes = _count(raw, "min_nodes", "--min-nodes '{}': give the fewest hosts the run may go on with (1 or more)")
    if o.min_nodes == 0:
        raise LaunchError("--min-nodes 0: give at least 1 (the fewest hosts the run may go on with)", 2)
    port = raw.get("master_port", environ.get("MASTER_PORT", ""))
    if port:
        if not re.fullmatch(r"[0-9]+", port) or not 0 < int(port) < 65536:
            raise LaunchError(f"--master-port '{port}' is not a port number", 2)
        o.master_port = int(port)
    if not o.recipe:
        raise LaunchError("no recipe given (usage: launch/train.sh RECIPE [--hostfile FILE] [options] "
                          "[-- overrides]; see --help)", 2)
    if not o.backend:
        o.backend = "local" if not o.hostfile else "deepspeed" if shutil.which("pdsh") else "torchrun-ssh"
    if o.backend not in BACKENDS:
        raise LaunchError(f"--backend '{o.backend}' unknown; use deepspeed, torchrun-ssh, slurm or local", 2)
    if o.backend not in ("local", "slurm") and not o.hostfile:
        raise LaunchError(f"--backend {o.backend} needs --hostfile FILE (or LAUNCH_HOSTFILE)", 2)


def _apply_slurm(o: Options, raw: dict, slurm_flags: list[str]) -> None:
    """The Slurm options: only with --backend slurm; --nodes/--gpus-per-node instead of a hostfile, not with one."""
    if slurm_flags and o.backend != "slurm":
        raise LaunchError(f"{slurm_flags[0]} is a Slurm option: add --backend slurm (or drop it)", 2)
    if o.backend != "slurm":
        return
    o.nodes = _count(raw, "nodes", "--nodes '{}': give a number of nodes") or 0
    o.gpus_per_node = _count(raw, "gpus_per_node", "--gpus-per-node '{}': give a number of ranks per node") or 0
    if "nodes" in raw and o.nodes < 1 or "gpus_per_node" in raw and o.gpus_per_node < 1:
        raise LaunchError("--nodes and --gpus-per-node must be at least 1", 2)
    slurm_exclude = ""
    if o.hostfile:
        for flag, key, fix in (("--nodes", "nodes", "narrow them with --num-nodes N"),
                               ("--gpus-per-node", "gpus_per_node", "its slots= give the ranks per node; --num-gpus "
                                                                    "N narrows them")):
            if key in raw:
                raise LaunchError(f"{flag} is for Slurm without a hostfile (Slurm picks the nodes); with --hostfile "
                                  f"the hosts are the hostfile's: {fix}, or drop --hostfile (and LAUNCH_HOSTFILE)", 2)
    else:
        if not o.nodes:
            raise LaunchError("--backend slurm needs --nodes N (Slurm picks the nodes) or --hostfile FILE (or "
                              "LAUNCH_HOSTFILE)", 2)
        if o.include or o.num_nodes or o.num_gpus or o.pin_nodes:
            flag = "--include" if o.include else "--num-nodes" if o.num_nodes else "--num-gpus" if o.num_gpus \
                else "--pin-nodes"
            raise LaunchError(f"{flag} narrows a hostfile's hosts; without one, Slurm picks the nodes: use --nodes, "
                              "--gpus-per-node, --nodelist or --exclude (Slurm syntax)", 2)
        slurm_exclude, o.exclude = o.exclude, ""  # without a hostfile, --exclude is Slurm's node list
    if o.pin_nodes and "nodelist" in raw:
        raise LaunchError("--pin-nodes and --nodelist both choose the nodes: give one", 2)
    o.slurm = request(raw.get("partition", ""), raw.get("account", ""), raw.get("time", ""), raw.get("qos", ""),
                      o.exclusive, raw.get("nodelist", ""), slurm_exclude, raw.get("image", ""),
                      raw.get("mounts", ""), raw.get("workdir", ""))
