"""A run in a container (--container-image, pyxis) sees only what is mounted into it: every path the ranks read or
write must be visible inside at the same path (`--container-mounts=/lustre:/lustre`): the run's log dir (exit
records, heartbeats, the 0600 env file), the recipe file, checkpoint.dir and the data. Relative recipe paths would
mean something else inside (the ranks run in the image's repository), so they must be absolute. Each problem is one
line with the fix, exit 2, before anything is written."""
from __future__ import annotations

import os
from pathlib import Path

from launch.common import LaunchError
from launch.slurm_request import Container


def _recipe_paths(recipe) -> list[tuple[str, str]]:
    """(field, path) for every path in the recipe the ranks open."""
    data = recipe.data
    out = [("checkpoint.dir", recipe.checkpoint.dir or "")]
    out += [(f"data.manifests[{i}]", str(m)) for i, m in enumerate(data.manifests)]
    out += [(f"data.blend[{i}]", str(p)) for i, (_, p) in enumerate(data.blend)]
    for s, stage in enumerate(data.stages):
        out += [(f"data.stages.{s}.manifests[{i}]", str(m)) for i, m in enumerate(stage.manifests)]
        out += [(f"data.stages.{s}.blend[{i}]", str(p)) for i, (_, p) in enumerate(stage.blend)]
    if data.tokenizer:
        out.append(("data.tokenizer", data.tokenizer))
    return [(f, p) for f, p in out if p and "://" not in p]


def problems(container: Container, recipe, log_dir: Path, recipe_file: str) -> list[str]:
    mounts = container.mounts_text() or "none"
    fix = f"add SRC:SRC for it to --container-mounts (now: {mounts})"
    found = []
    for what, path in [("the log dir", str(log_dir)),
                       *([("the recipe file", os.path.abspath(recipe_file))] if os.path.isfile(recipe_file) else [])]:
        if not container.inside(path):
            found.append(f"{what} {path} is not mounted at the same path in the container: {fix}")
    for field, path in _recipe_paths(recipe):
        if not os.path.isabs(path):
            found.append(f"{field} = {path} is relative: in the container the ranks run in {container.workdir}; give "
                         "an absolute path on a mounted file system")
        elif not container.inside(path):
            found.append(f"{field} = {path} is not mounted at the same path in the container: {fix}")
    return found


def check(container: Container, recipe, log_dir: Path, recipe_file: str) -> None:
    found = problems(container, recipe, log_dir, recipe_file)
    if found:
        raise LaunchError("the container would not see what the run reads and writes:\n" + "\n".join(
            f"  - {p}" for p in found), 2)
