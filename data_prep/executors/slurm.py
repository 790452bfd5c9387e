"""Slurm job arrays: scripts whose array task I runs `tokenize --slice I/N`, chunked to respect MaxArraySize.

Each array task is one slice of the deterministic unit plan. Scripts are written to ``scripts_dir``: one array
script per chunk (its task ids offset so chunk c covers slices c*max .. ), a finalize script (`--merge-only`) that
runs after all chunks (afterany), and submit.sh that sbatches them in order. Per-task logs go to
``logs/prep_%A_%a.out``. ``only_slices`` (from --only-incomplete) lists just the slices that still have incomplete
units, so a rerun resubmits only what failed.

The scripts run ``python`` (the venv's interpreter, where data_prep is installed) from ``workdir``; the nodes must
see the venv, the inputs and the output directory at the same paths (a shared file system).
"""

from __future__ import annotations

import os
import shlex
from typing import List, Optional, Sequence


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


def render(tokenize_args: List[str], tasks: int, scripts_dir: str, python: str, workdir: str,
           max_array_size: int = 1001, cpus_per_task: int = 8, time_limit: str = "24:00:00",
           partition: Optional[str] = None, max_concurrent: int = 0, only_slices: Optional[List[int]] = None) -> List[str]:
    """Write the scripts; returns their paths (array chunks..., finalize, submit.sh)."""
    if tasks < 1:
        raise ValueError("--tasks must be >= 1")
    os.makedirs(os.path.join(scripts_dir, "logs"), exist_ok=True)
    scripts_dir = os.path.abspath(scripts_dir)
    wanted = sorted(set(range(tasks) if only_slices is None else only_slices))
    per = max_array_size - 1 if max_array_size > 1 else 1  # task ids must stay < MaxArraySize
    args = " ".join(shlex.quote(a) for a in tokenize_args)
    head = ["#!/bin/bash", "#SBATCH --job-name=data_prep", f"#SBATCH --cpus-per-task={cpus_per_task}",
            "#SBATCH --ntasks=1", f"#SBATCH --time={time_limit}"]
    if partition:
        head.append(f"#SBATCH --partition={partition}")
    paths = []
    for c in range(0, tasks, per):
        ids = [t - c for t in wanted if c <= t < c + per]
        if not ids:
            continue
        arr = _ranges(ids) + (f"%{max_concurrent}" if max_concurrent else "")
        body = head + [
            f"#SBATCH --array={arr}",
            f"#SBATCH --output={scripts_dir}/logs/prep_%A_%a.out",
            "set -euo pipefail",
            f"SLICE=$(( SLURM_ARRAY_TASK_ID + {c} ))",
            f"cd {shlex.quote(workdir)}",  # relative input/output paths mean what they meant at render time
            "export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false",
            f"exec {shlex.quote(python)} -m data_prep tokenize {args} --slice \"$SLICE/{tasks}\" "
            "-j \"${SLURM_CPUS_PER_TASK:-1}\" -q",
        ]
        path = os.path.join(scripts_dir, f"array_{c // per:04d}.sbatch")
        with open(path, "w") as f:
            f.write("\n".join(body) + "\n")
        paths.append(path)
    fin = head[:2] + ["#SBATCH --cpus-per-task=1", "#SBATCH --ntasks=1", f"#SBATCH --time={time_limit}"] + (
        [f"#SBATCH --partition={partition}"] if partition else []) + [
        f"#SBATCH --output={scripts_dir}/logs/finalize_%j.out",
        "set -euo pipefail",
        f"cd {shlex.quote(workdir)}",
        f"exec {shlex.quote(python)} -m data_prep tokenize {args} --merge-only -q",
    ]
    fin_path = os.path.join(scripts_dir, "finalize.sbatch")
    with open(fin_path, "w") as f:
        f.write("\n".join(fin) + "\n")
    submit = ["#!/bin/bash", "# Submits the array chunks, then finalize after all of them (afterany: it reports "
              "failed units).", "set -euo pipefail", "ids=()"]
    for p in paths:
        submit.append(f"ids+=($(sbatch --parsable {shlex.quote(p)}))")
    submit += ['dep=$(IFS=:; echo "${ids[*]}")',
               f'if [ -n "$dep" ]; then sbatch --dependency="afterany:$dep" {shlex.quote(fin_path)}; '
               f'else sbatch {shlex.quote(fin_path)}; fi',
               'echo "submitted array jobs: ${ids[*]:-none}"']
    sub_path = os.path.join(scripts_dir, "submit.sh")
    with open(sub_path, "w") as f:
        f.write("\n".join(submit) + "\n")
    os.chmod(sub_path, 0o755)
    return paths + [fin_path, sub_path]
