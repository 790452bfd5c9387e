"""Slurm job arrays: scripts whose array task I runs `tokenize --slice I/N` (or `curate`), chunked to respect
MaxArraySize.

Each array task is one slice of the deterministic unit plan. Scripts are written to ``scripts_dir``: one array
script per chunk (its task ids offset so chunk c covers slices c*max .. ), a finalize script (`--merge-only`) that
runs after all chunks (afterany), and submit.sh that sbatches them in order. Per-task logs go to
``logs/prep_%A_%a.out``. ``only_slices`` (from --only-incomplete) lists just the slices that still have incomplete
units, so a rerun resubmits only what failed.

With curation steps (`curate`, `tokenize --steps`) the passes are global: every slice must finish the hash pass
before any bucket task starts, and every bucket before any filter task. Each pass is then its own array
(``hash_NNNN``, ``buckets_NNNN``, ``filter_NNNN`` running ``--stage hash|buckets|filter``), chained with
``--dependency=afterok:<every chunk of the previous pass>``, and ``--kill-on-invalid-dep=yes`` so that a failed task
cancels the later passes instead of leaving them pending forever; finalize (afterany on the last pass) then runs
and lists what is missing. ``only_slices`` is then a dict: pass -> its slices with work left; a pass with none is
not submitted.

The scripts run ``python`` (the venv's interpreter, where data_prep is installed) from ``workdir``; the nodes must
see the venv, the inputs and the output directory at the same paths (a shared file system). Slurm chooses the nodes
(no node list); ``partition``, ``account``, ``qos`` and ``time_limit`` become `#SBATCH` lines, each checked to be a
value sbatch accepts so that no line can carry another.
"""

from __future__ import annotations

import os
import re
import shlex
from typing import Dict, List, Optional, Sequence, Union

from data_prep import file_modes, io

CURATION_STAGES = ("hash", "buckets", "filter")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.,+-]*")  # partition, account, qos (comma lists too)
# sbatch --time: minutes | MM:SS | HH:MM:SS | D-HH | D-HH:MM | D-HH:MM:SS | UNLIMITED
_TIME = re.compile(r"\d+-\d+(?::\d+){0,2}|\d+(?::\d+){0,2}|UNLIMITED|INFINITE")


def sbatch_lines(time_limit: str, partition: Optional[str] = None, account: Optional[str] = None,
                 qos: Optional[str] = None) -> List[str]:
    """The request's `#SBATCH` lines; ValueError naming the flag for a value sbatch would not take."""
    if not _TIME.fullmatch(time_limit or ""):
        raise ValueError(f"--time '{time_limit}': give minutes, HH:MM:SS or D-HH:MM:SS (e.g. 24:00:00)")
    lines = [f"#SBATCH --time={time_limit}"]
    for flag, value in (("partition", partition), ("account", account), ("qos", qos)):
        if value is None:
            continue
        if not _NAME.fullmatch(value):
            raise ValueError(f"--{flag} '{value}': not a {flag} name sbatch accepts (letters, digits, _.,+-)")
        lines.append(f"#SBATCH --{flag}={value}")
    return lines


def _ranges(ids: Sequence[int]) -> str:
    """[0,1,2,5,7,8] -> '0-2,5,7-8' (Slurm --array syntax)."""
    out, i = [], 0
    ids = sorted(ids)
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(out)


def render(args: List[str], tasks: int, scripts_dir: str, python: str, workdir: str,
           max_array_size: int = 1001, cpus_per_task: int = 8, time_limit: str = "24:00:00",
           partition: Optional[str] = None, max_concurrent: int = 0,
           only_slices: Union[None, List[int], Dict[str, List[int]]] = None, command: str = "tokenize",
           stages: Sequence[str] = (), account: Optional[str] = None, qos: Optional[str] = None) -> List[str]:
    """Write the scripts; returns their paths (array chunks of each stage in order..., finalize, submit.sh).

    ``args``: the arguments of ``command`` (tokenize or curate) without --slice; ``stages``: the curation passes to
    chain (empty: one array of plain slices)."""
    if tasks < 1:
        raise ValueError("--tasks must be >= 1")
    request = sbatch_lines(time_limit, partition or None, account, qos)  # refused before anything is written
    os.makedirs(os.path.join(scripts_dir, "logs"), exist_ok=True)
    scripts_dir = os.path.abspath(scripts_dir)
    per = max_array_size - 1 if max_array_size > 1 else 1  # task ids must stay < MaxArraySize
    quoted = " ".join(shlex.quote(a) for a in args)
    head = ["#!/bin/bash", "#SBATCH --job-name=data_prep", f"#SBATCH --cpus-per-task={cpus_per_task}",
            "#SBATCH --ntasks=1", *request]
    chained = []  # (stage label, [array chunk paths]) in submission order
    for stage in stages or ("",):
        if only_slices is None:
            wanted = list(range(tasks))
        elif isinstance(only_slices, dict):
            wanted = sorted(set(only_slices.get(stage, range(tasks))))
        else:
            wanted = sorted(set(only_slices))
        paths = []
        for c in range(0, tasks, per):
            ids = [t - c for t in wanted if c <= t < c + per]
            if not ids:
                continue
            arr = _ranges(ids) + (f"%{max_concurrent}" if max_concurrent else "")
            body = head[:1] + [f"#SBATCH --job-name=data_prep{'_' + stage if stage else ''}"] + head[2:] + [
                f"#SBATCH --array={arr}",
                f"#SBATCH --output={scripts_dir}/logs/{stage or 'prep'}_%A_%a.out",
                "set -euo pipefail",
                f"SLICE=$(( SLURM_ARRAY_TASK_ID + {c} ))",
                f"cd {shlex.quote(workdir)}",  # relative input/output paths mean what they meant at render time
                "export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false",
                f"exec {shlex.quote(python)} -m data_prep {command} {quoted} --slice \"$SLICE/{tasks}\" "
                + (f"--stage {stage} " if stage else "") + "-j \"${SLURM_CPUS_PER_TASK:-1}\" -q",
            ]
            path = os.path.join(scripts_dir, f"{stage or 'array'}_{c // per:04d}.sbatch")
            io.atomic_write(path, "\n".join(body) + "\n", fsync=False)  # never a torn script for sbatch
            paths.append(path)
        if paths:
            chained.append((stage, paths))
    fin = head[:2] + ["#SBATCH --cpus-per-task=1", "#SBATCH --ntasks=1", *request] + [
        f"#SBATCH --output={scripts_dir}/logs/finalize_%j.out",
        "set -euo pipefail",
        f"cd {shlex.quote(workdir)}",
        f"exec {shlex.quote(python)} -m data_prep {command} {quoted} --merge-only -q",
    ]
    fin_path = os.path.join(scripts_dir, "finalize.sbatch")
    io.atomic_write(fin_path, "\n".join(fin) + "\n", fsync=False)
    sub_path = os.path.join(scripts_dir, "submit.sh")
    io.atomic_write(sub_path, "\n".join(_submit_script(chained, fin_path)) + "\n", fsync=False)
    mode = file_modes.current()  # a script: the file mode with x (0640 -> 0750); 0755 by default
    os.chmod(sub_path, 0o755 if mode is None else file_modes.dir_mode(mode))
    return [p for _, paths in chained for p in paths] + [fin_path, sub_path]


def _submit_script(chained: List[tuple], fin_path: str) -> List[str]:
    lines = ["#!/bin/bash",
             "# Submits the array chunks stage by stage (each stage after every chunk of the previous one succeeded: "
             "afterok;", "# a failure cancels the later stages), then finalize after the last (afterany: it reports "
             "what is missing).", "set -euo pipefail", "dep=\"\"",
             "submit() {  # script -> job id; after the previous stage if there is one",
             '  if [ -n "$dep" ]; then sbatch --parsable --dependency="afterok:$dep" --kill-on-invalid-dep=yes "$1"',
             '  else sbatch --parsable "$1"; fi', "}"]
    for stage, paths in chained:
        lines.append("ids=()")
        lines += [f"ids+=($(submit {shlex.quote(p)}))" for p in paths]
        lines += [f'echo "submitted {stage + " " if stage else ""}array jobs: ${{ids[*]}}"',
                  'dep=$(IFS=:; echo "${ids[*]}")']
    lines += [f'if [ -n "$dep" ]; then sbatch --dependency="afterany:$dep" {shlex.quote(fin_path)}; '
              f'else sbatch {shlex.quote(fin_path)}; fi']
    if not chained:
        lines.append('echo "submitted array jobs: none"')
    return lines
