"""`launch/train.sh` (python -m launch train): check everything a run needs before anything starts (hostfile, layout,
variables, the log dir, the checkpoint lease, every node over ssh), write the run directory, then hand the run to the
supervisor (or submit the Slurm job script, or only print the plan with --dry-run)."""
from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import socket
import subprocess
import time
import zlib
from pathlib import Path

from launch import container_check, elastic, environment, plan, recipe_check, run_files
from launch.backends import make as make_backend
from launch.backends.base import Backend, Launch
from launch.common import REPO_DIR, RUN_ID_RE, LaunchError, python, say, venv_dir
from launch.guard import Guard
from launch.options import Options
from launch.slurm_request import time_seconds
from launch.ssh import Ssh, check_reachable, drop_file, push_private_file
from launch.supervise import Policy, Supervisor
from recipes.config.file_mode import apply_recipe_mode

_PROBE = """import socket, sys
for p in range(int(sys.argv[1]), int(sys.argv[1]) + 16):
    with socket.socket() as s:
        try:
            s.bind(("", p)); print(p); break
        except OSError:
            pass"""


def _free_local(base: int) -> int | None:
    for p in range(base, base + 16):
        with socket.socket() as s:
            try:
                s.bind(("", p))
                return p
            except OSError:
                pass
    return None


def pick_port(run_id: str, backend: str, host0: str, ssh: Ssh | None, dry_run: bool) -> int:
    """Derived from the run id (two runs sharing a first host get different ports: with one fixed default the second
    fails or joins the first one's unauthenticated TCPStore), then the first of 16 from there that is free on the
    master (not probed in a dry run, or for Slurm, where the master is only known when the job starts). Below 32768,
    where Linux's ephemeral ports start: no connection on the master takes it as its source port before rank 0
    listens."""
    base = 20000 + zlib.crc32(run_id.encode()) % 12000  # + 16 probed: < 32768
    if dry_run or backend == "slurm":
        return base
    if backend == "local":
        port = _free_local(base)
    else:
        r = ssh.run(host0, f"{shlex.quote(python())} -c {shlex.quote(_PROBE)} {base}")
        port = int(r.stdout.strip()) if r.stdout.strip().isdigit() else None
    if port is None:
        say(f"could not probe a free port on {host0}; using {base}")
    return port or base


def _rank_cmd(opts: Options, repo: str, rank_python: str) -> list[str]:
    entry = opts.entry.split()
    if entry and entry[0] == "python":
        entry[0] = rank_python
    recipe = os.path.abspath(opts.recipe) if os.path.exists(opts.recipe) else opts.recipe
    return [os.path.join(repo, "launch", "rank_exec.sh"), *entry, "--config", recipe, *opts.overrides]


def _log_path(opts: Options, run_id: str) -> Path:
    return Path(os.path.abspath(opts.log_dir or REPO_DIR / "runs" / "launch" / run_id))


def _log_dir(d: Path) -> Path:
    if d.exists() and not d.is_dir():
        raise LaunchError(f"--log-dir {d} is a file; give a directory for the run's logs (created when missing)", 2)
    return run_files.make_private_dir(d)


def _run_id(opts: Options) -> str:
    stem = os.path.basename(os.path.splitext(opts.recipe)[0])
    run_id = opts.run_id or "".join(c if c.isalnum() or c in "._-" else "_" for c in stem) + \
        f"-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    if not RUN_ID_RE.match(run_id):
        raise LaunchError(f"--run-id '{run_id}': use letters, digits, '.', '_' and '-' only", 2)
    return run_id


def _nodes(opts: Options, ssh: Ssh, recipe_gpus_per_node: int = 0) -> plan.NodePlan:
    nodes = plan.select(opts, recipe_gpus_per_node)
    plan.check_shape(nodes, opts.backend)
    if opts.backend == "slurm" and (opts.max_restarts is not None or opts.spares > 0):
        raise LaunchError("--max-restarts and --spares are for the local, torchrun-ssh and deepspeed back ends; under "
                          "Slurm the job requeues itself (scontrol requeue, or a node failure) and Slurm picks the "
                          "nodes: drop these options", 2)
    if opts.backend == "slurm":  # the job's first node, known when it starts
        addr = opts.master_addr or "<first node of the job>"
    else:
        addr = opts.master_addr or ("127.0.0.1" if opts.backend == "local" else ssh.resolve_addr(nodes[0].host))
    world, spares = plan.split_spares(nodes, opts.spares, opts.backend)
    return plan.NodePlan(world, addr, spares, slurm_picks=opts.backend == "slurm" and not opts.hostfile)


def world_of(opts: Options, nodes: plan.NodePlan) -> recipe_check.World:
    slots = {n.slots for n in nodes.nodes}
    per = next(iter(slots)) if len(slots) == 1 else None
    if nodes.slurm_picks:
        source = f"--nodes {len(nodes.nodes)} x --gpus-per-node {per}"
    elif opts.hostfile:
        source = "the hostfile selection"
    else:
        source = f"{per} rank(s) on this machine"
    return recipe_check.World(nodes.world_size, len(nodes.nodes), per, source)


def checked_plan(opts: Options, ssh: Ssh) -> tuple[plan.NodePlan, recipe_check.Facts, object]:
    """The node plan and the recipe checked for its world (launch/recipe_check.py); the recipe too."""
    recipe = recipe_check.load(opts.recipe, opts.overrides)
    nodes = _nodes(opts, ssh, recipe.cluster.gpus_per_node)
    facts = recipe_check.check(recipe, opts.recipe, world_of(opts, nodes), opts.overrides, opts.entry)
    return nodes, facts, recipe


def _stop_grace(recipe_s: float) -> float:
    """How long a stop waits for the ranks' pre-emption save: LAUNCH_STOP_GRACE, else the recipe's."""
    text = os.environ.get("LAUNCH_STOP_GRACE") or str(recipe_s)
    if not text.replace(".", "", 1).isdigit():
        raise LaunchError(f"LAUNCH_STOP_GRACE='{text}': give the seconds a stop waits for the ranks' save", 2)
    return float(text)


def _slurm_grace() -> int:
    text = os.environ.get("LAUNCH_SLURM_GRACE", "300")
    if not text.isdigit():
        raise LaunchError(f"LAUNCH_SLURM_GRACE='{text}': give the seconds before the time limit at which the job "
                          "saves and requeues itself", 2)
    return int(text)


def _slurm_request(opts: Options, nodes: plan.NodePlan, grace: int):
    """The job's request; --pin-nodes becomes the hostfile's node list; a time limit must leave the grace."""
    req = opts.slurm
    if opts.pin_nodes:
        req = dataclasses.replace(req, nodelist=",".join(nodes.hosts))
    limit = time_seconds(req.time) if req.time else None
    if limit is not None and limit <= grace:
        raise LaunchError(f"--time {req.time} is not longer than LAUNCH_SLURM_GRACE={grace} s, the warning before "
                          "the limit at which the job saves and requeues itself: give a longer --time or a smaller "
                          "LAUNCH_SLURM_GRACE", 2)
    return req


def setup(opts: Options, ssh: Ssh) -> tuple[Launch, Backend, recipe_check.Facts]:
    """Every check that needs no node; refusals exit before the log dir exists (except a bad log dir itself)."""
    environment.check_names(opts.env_names, os.environ)
    nodes, facts, recipe = checked_plan(opts, ssh)
    apply_recipe_mode(recipe)  # checkpoint.file_mode: the log dir and every file the launcher writes in it
    facts.stop_grace_s = _stop_grace(facts.stop_grace_s)
    grace = _slurm_grace() if opts.backend == "slurm" else 300
    slurm = _slurm_request(opts, nodes, grace) if opts.backend == "slurm" else None
    run_id = _run_id(opts)
    port = opts.master_port or pick_port(run_id, opts.backend, nodes.hosts[0], ssh, opts.dry_run)
    log_path = _log_path(opts, run_id)
    container = slurm.container if slurm else None
    if container:  # the ranks' repository, venv and Python are the image's; what they read and write is mounted
        container_check.check(container, recipe, log_path, opts.recipe)
    repo = container.workdir if container else str(REPO_DIR)
    venv = os.path.join(repo, ".venv") if container else venv_dir()
    rank_python = os.path.join(venv, "bin", "python")
    log_dir = _log_dir(log_path)
    secrets = environment.secret_names(opts.env_names, os.environ)
    secret_file = str(log_dir / "secret.env") if secrets else None
    launch = Launch(run_id=run_id, log_dir=log_dir, plan=nodes, master_port=port,
                    env_lines=environment.launch_env(run_id, venv, secret_file, os.environ, secrets),
                    rank_cmd=_rank_cmd(opts, repo, rank_python), secret_names=secrets, repo=repo, venv=venv,
                    python=rank_python, layout=facts.layout, device=facts.device, master_addr_opt=opts.master_addr,
                    slurm_grace_s=grace, slurm=slurm, launcher_repo=str(REPO_DIR), launcher_python=python())
    backend = make_backend(opts.backend, ssh)
    backend.check(launch, starting=False)
    return launch, backend, facts


def plan_text(launch: Launch, backend: Backend, notes: list[str] = ()) -> str:
    env_names = [line.split("=", 1)[0] for line in launch.env_lines + backend.env_extra(launch)]
    lines = [f"plan: backend={backend.name} nodes={len(launch.nodes)} world_size={launch.plan.world_size} "
             f"master={launch.plan.master_addr}:{launch.master_port} run_id={launch.run_id}",
             f"layout: {launch.layout}", *notes, f"logs: {launch.log_dir}", f"env: {' '.join(env_names)}"]
    if launch.secret_names:  # names only: the values reach the ranks in the 0600 file, never a plan or a log
        lines.append(f"user env (values not shown): {' '.join(launch.secret_names)}")
    return "\n".join(lines + backend.plan_lines(launch)) + "\n"


def write_run_files(launch: Launch, backend: Backend, notes: list[str] = ()) -> str:
    d = launch.log_dir
    run_files.write(d / "launch.env", "".join(line + "\n" for line in launch.env_lines + backend.env_extra(launch)),
                    private=False)
    for name, text in backend.files(launch).items():
        run_files.write(d / name, text, private=False)
    text = plan_text(launch, backend, notes)
    run_files.write(d / "plan.txt", text, private=False)
    return text


def train(opts: Options) -> int:
    ssh = Ssh()
    try:
        launch, backend, facts = setup(opts, ssh)
        text = write_run_files(launch, backend, facts.notes)
        if opts.dry_run:
            print(text, end="")
            if backend.name == "slurm":
                print(f"--- {launch.log_dir}/job.sbatch\n" + run_files.read(launch.log_dir / "job.sbatch"), end="")
            return 0
        for note in facts.notes:  # the dry run printed them with the plan
            say(note)
        return start(opts, launch, backend, facts, ssh)
    finally:
        ssh.close()


# --- start ------------------------------------------------------------------------------------------------------

def set_aside_previous(log_dir: Path) -> None:
    """A reused --log-dir: the previous run's logs, records and attempts move aside (they must not end this run)."""
    old = [*log_dir.glob("*.log"), *log_dir.glob("attempt-*"), *(log_dir / n for n in ("stop_requested",
                                                                                     "restarts.jsonl"))]
    old = [p for p in old if p.exists()]
    if not old:
        return
    prev = log_dir / f"previous-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    prev.mkdir()
    for p in old:
        os.replace(p, prev / p.name)
    say(f"moved the previous run's logs in {log_dir} to {prev}")


def take_lease(facts: recipe_check.Facts, run_id: str) -> None:
    """One run per checkpoint.dir (recipes/checkpoint/lease.py): refused here, before anything starts."""
    if not facts.checkpoint_dir:
        return
    from recipes.checkpoint.lease import holder_problem

    problem = holder_problem(facts.checkpoint_dir, run_id)
    if problem:
        raise LaunchError(f"{problem}\nnothing was started", 5)


def submit(launch: Launch) -> int:
    job = launch.log_dir / "job.sbatch"
    if not shutil.which("sbatch"):
        raise LaunchError(f"sbatch not found: this is not a Slurm login node. The job script is {job} (--dry-run "
                          "prints it)")
    r = subprocess.run(["sbatch", "--parsable", str(job)], capture_output=True, text=True)
    if r.returncode != 0:
        raise LaunchError(f"sbatch refused {job}: {(r.stdout + r.stderr).strip()}")
    job_id = r.stdout.strip().split(";")[0]
    run_files.write(launch.log_dir / "slurm_job_id", job_id + "\n", private=False)
    say(f"submitted Slurm job {job_id}; logs in {launch.log_dir}; stop with launch/stop.sh {launch.log_dir}")
    return 0


def _policy(opts: Options, launch: Launch, facts: recipe_check.Facts, ssh: Ssh, grace: float) -> Policy:
    port = None if opts.master_port else \
        (lambda: pick_port(launch.run_id, opts.backend, launch.plan.hosts[0], ssh, False))
    addr = None if opts.master_addr or opts.backend == "local" else ssh.resolve_addr
    return Policy(max_restarts=facts.max_restarts if opts.max_restarts is None else opts.max_restarts,
                  backoff_s=facts.backoff_s, backoff_max_s=facts.backoff_max_s, hang_timeout_s=facts.hang_timeout_s,
                  spares_n=opts.spares, stop_grace_s=grace, checkpoint_dir=facts.checkpoint_dir, pick_port=port,
                  resolve_addr=addr, preflight_spares=not opts.no_preflight, min_nodes=opts.min_nodes,
                  resize=(lambda nodes: resize(opts, launch, nodes)) if opts.min_nodes else None)


def resize(opts: Options, launch: Launch, nodes: list) -> elastic.Resize:
    """The run on `nodes` (launch/elastic.py): the recipe checked for that world as for the first one, the ranks'
    command with its new DP; LaunchError with the reason when it cannot run there."""
    recipe = recipe_check.load(opts.recipe, opts.overrides)
    extra, dp = elastic.world_overrides(recipe.parallel, nodes)
    overrides = [*opts.overrides, *extra]
    recipe = recipe_check.load(opts.recipe, overrides)
    slots = {n.slots for n in nodes}
    world = recipe_check.World(sum(n.slots for n in nodes), len(nodes), next(iter(slots)) if len(slots) == 1 else
                               None, "the nodes that answer")
    facts = recipe_check.check(recipe, opts.recipe, world, overrides, opts.entry)
    return elastic.Resize(nodes=list(nodes), rank_cmd=_rank_cmd(dataclasses.replace(opts, overrides=overrides),
                                                                launch.repo, launch.python), layout=facts.layout,
                          dp=dp)


def _announce(launch: Launch, backend: Backend, policy: Policy) -> None:
    say(f"run {launch.run_id}: {backend.name} on {len(launch.nodes)} node(s), world size {launch.plan.world_size} "
        f"({launch.layout}), master {launch.plan.master_addr}:{launch.master_port}")
    say(f"logs: {launch.log_dir}/<host>.log")
    if policy.max_restarts:
        spares = f"; spares: {' '.join(n.host for n in launch.plan.spares)}" if launch.plan.spares else ""
        say(f"restarts: up to {policy.max_restarts} from the newest complete checkpoint (back-off "
            f"{policy.backoff_s:g} s doubling, at most {policy.backoff_max_s:g} s){spares}")
    if policy.hang_timeout_s:
        say(f"hang watchdog: every rank's stack dumped and the job stopped when no rank advances for "
            f"{policy.hang_timeout_s:g} s")


def start(opts: Options, launch: Launch, backend: Backend, facts: recipe_check.Facts, ssh: Ssh) -> int:
    d = launch.log_dir
    if backend.name == "slurm":
        backend.check(launch, starting=True)  # e.g. a container without pyxis: refused before anything is written
    set_aside_previous(d)
    # no hosts yet when Slurm picks them
    run_files.write(d / "hosts", "".join(h + "\n" for h in launch.plan.hosts if h), private=False)
    run_files.write(d / "backend", backend.name + "\n", private=False)
    take_lease(facts, launch.run_id)
    # How long a stop waits for the ranks' pre-emption save; stop.sh reads it from the run directory.
    grace = facts.stop_grace_s
    run_files.write(d / "stop_grace", f"{grace:g}\n", private=False)
    secret = str(d / "secret.env") if launch.secret_names else None
    if secret:
        environment.write_secret_file(Path(secret), launch.secret_names, os.environ)
    if backend.name == "slurm":
        return submit(launch)  # the job removes the env file when it ends
    try:
        return supervise(opts, launch, backend, facts, ssh, grace, secret)
    finally:
        if secret:
            drop_file(ssh, [] if backend.name == "local" else launch.plan.hosts, secret)


def supervise(opts, launch, backend, facts, ssh, grace, secret) -> int:
    backend.check(launch, starting=True)
    remote = backend.name != "local"
    if remote and not opts.no_preflight and not check_reachable(ssh, launch.plan.hosts):
        raise LaunchError("some nodes are not ready (see above); nothing was started", 4)
    if remote and secret and not push_private_file(ssh, launch.plan.hosts, secret):
        raise LaunchError("could not copy the env file to every node (see above); nothing was started", 4)
    policy = _policy(opts, launch, facts, ssh, grace)
    _announce(launch, backend, policy)
    # A SIGKILLed launcher runs no handler: the guard then stops the run on every node by run id.
    guard = Guard(["--by-launcher", str(launch.log_dir)], str(launch.log_dir / "launcher.log"), f"run {launch.run_id}")
    try:
        return Supervisor(launch, backend, policy, ssh, opts.quiet, secret).run()
    finally:
        guard.release()
