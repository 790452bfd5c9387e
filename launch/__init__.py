"""The launcher: start, supervise, restart and stop a training run (or a data prep) on the hosts of a DeepSpeed-style
hostfile, or as a Slurm job on the nodes Slurm picks. The bash entry points users type (train.sh, preflight.sh, stop.sh, prep.sh) are shims over
`python -m launch <command>`; rank_exec.sh (around each rank) and node_check.sh (preflight, on each node) stay small.

    common        where things are (repo, venv, python), LaunchError (a message and an exit code), the log line
    options       the command-line options of train / preflight (DeepSpeed's hostfile vocabulary, Slurm's own)
    slurm_request what a Slurm job asks for (partition, account, time, QOS, node list, pyxis container), checked
    hostfile      parse, validate and narrow a hostfile; the host-name rule
    plan          the node plan: hosts (unnamed when Slurm picks them), slots, devices, world size, master, spares
    recipe_check  the recipe for the world it will start: layout, memory, the world's change, validate_for_launch;
                  the recipe's facts the launcher acts on
    container_check  what the ranks read and write is mounted at the same path in a container
    environment   what every rank gets: plumbing variables, the user's variables in a 0600 file
    ssh           ssh with the user's config; reachability; copying a file to every node
    backends/     local, torchrun over ssh, DeepSpeed's pdsh runner, Slurm: each renders its commands from data
    failures      per-rank exit records: which rank failed first (nothing a rank prints can end a run)
    watchdog      heartbeats, the hang verdict, where to send the stack-dump signal
    supervise     attempts, the restart decision, spares, back-off, the restart record
    procs         the node processes of an attempt and their logs
    stop          stopping a run (by run id on every node; Slurm: the job step, then the grace)
    guard         the launcher-death watchdog (a SIGKILLed launcher still stops its run)
    train, preflight, prep, cli    the commands
    commcheck     the all-reduce bandwidth check (run as the per-rank entry)
Nothing outside launch imports it; it imports recipes' config, parallel, planner (validation) and checkpoint (lease,
newest checkpoint) for its checks (pyproject.toml's import contracts).
"""
