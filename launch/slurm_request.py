"""What a Slurm job asks for, from the command line (`--backend slurm`): nodes and ranks per node, the partition,
account, time limit, QOS, `--exclusive`, a node list or exclusions only when asked, and a pyxis/enroot container.
Each value is checked against what sbatch/srun accept, so that the job script holds it as plain text (no quoting
inside `#SBATCH` lines); every problem is one line and exit 2. It knows nothing of hostfiles or recipes."""
from __future__ import annotations

import re
from dataclasses import dataclass

from launch.common import LaunchError

# Where launch/container/Dockerfile installs the project (its .venv inside): the ranks' repository in a container.
CONTAINER_REPO = "/opt/llm-recipes"

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.,+-]*")                   # partition, account, qos (comma lists too)
_HOSTLIST = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.,\[\]-]*")           # gpu[001-004,007],gpu010
# minutes | MM:SS | HH:MM:SS | D-HH | D-HH:MM | D-HH:MM:SS (sbatch --time); UNLIMITED / INFINITE
_TIME = re.compile(r"(?:(\d+)-(\d+)(?::(\d+)(?::(\d+))?)?|(\d+)(?::(\d+)(?::(\d+))?)?|UNLIMITED|INFINITE)")
_IMAGE = re.compile(r"[A-Za-z0-9_./][A-Za-z0-9_.:/#@+=-]*")           # nvcr.io#nvidia/pytorch:25.01-py3, /x.sqsh
_PATH = re.compile(r"/[A-Za-z0-9_./+-]*")
_MOUNT_FLAGS = re.compile(r"[a-z]+(?:\+[a-z]+)*")                     # ro, ro+rprivate


@dataclass(frozen=True)
class Mount:
    src: str
    dst: str
    flags: str = ""


@dataclass(frozen=True)
class Container:
    """pyxis's srun options (https://github.com/NVIDIA/pyxis/wiki/Usage); `workdir` is also where the ranks find
    the repository and its .venv inside the image."""
    image: str
    mounts: tuple[Mount, ...] = ()
    workdir: str = CONTAINER_REPO

    def mounts_text(self) -> str:
        return ",".join(":".join(filter(None, (m.src, m.dst, m.flags))) for m in self.mounts)

    def srun_options(self) -> list[str]:
        out = [f"--container-image={self.image}"]
        if self.mounts:
            out.append(f"--container-mounts={self.mounts_text()}")
        return out + [f"--container-workdir={self.workdir}"]

    def inside(self, path: str) -> bool:
        """Whether `path` (absolute, on the host) is mounted at the same path in the container."""
        return any(m.src == m.dst and (path == m.src or path.startswith(m.src.rstrip("/") + "/"))
                   for m in self.mounts)


@dataclass(frozen=True)
class SlurmRequest:
    partition: str = ""
    account: str = ""
    time: str = ""
    qos: str = ""
    exclusive: bool = False
    nodelist: str = ""          # Slurm hostlist syntax; "" = Slurm chooses
    exclude: str = ""
    container: Container | None = None

    def sbatch_lines(self) -> list[str]:
        pairs = [("partition", self.partition), ("account", self.account), ("time", self.time), ("qos", self.qos),
                 ("nodelist", self.nodelist), ("exclude", self.exclude)]
        return [f"#SBATCH --{k}={v}" for k, v in pairs if v] + (["#SBATCH --exclusive"] if self.exclusive else [])


def time_seconds(text: str) -> int | None:
    """sbatch --time in seconds; None for UNLIMITED/INFINITE (the caller checked the syntax)."""
    m = _TIME.fullmatch(text)
    if m is None or m[0] in ("UNLIMITED", "INFINITE"):
        return None
    if m[1] is not None:  # D-HH[:MM[:SS]]
        d, h, mi, s = (int(x or 0) for x in m.group(1, 2, 3, 4))
        return ((d * 24 + h) * 60 + mi) * 60 + s
    parts = [int(x) for x in m.group(5, 6, 7) if x is not None]
    if len(parts) == 1:
        return parts[0] * 60  # minutes
    if len(parts) == 2:
        return parts[0] * 60 + parts[1]  # MM:SS
    return (parts[0] * 60 + parts[1]) * 60 + parts[2]


def _checked(flag: str, value: str, pattern: re.Pattern, example: str) -> str:
    if value and not pattern.fullmatch(value):
        raise LaunchError(f"{flag} '{value}': not a value sbatch accepts here (e.g. {example})", 2)
    return value


def parse_mounts(text: str) -> tuple[Mount, ...]:
    """pyxis's SRC:DST[:FLAGS][,SRC:DST...], both paths absolute."""
    out = []
    for part in text.split(","):
        fields = part.split(":")
        if len(fields) not in (2, 3) or not all(_PATH.fullmatch(f) for f in fields[:2]) or \
                (len(fields) == 3 and not _MOUNT_FLAGS.fullmatch(fields[2])):
            raise LaunchError(f"--container-mounts '{part}': give SRC:DST[:FLAGS] with absolute paths, comma-"
                              "separated (e.g. /lustre:/lustre,/scratch/data:/data:ro)", 2)
        out.append(Mount(*fields))
    return tuple(out)


def container_of(image: str, mounts: str, workdir: str) -> Container | None:
    if not image:
        if mounts or workdir:
            raise LaunchError("--container-mounts and --container-workdir go with --container-image IMAGE", 2)
        return None
    _checked("--container-image", image, _IMAGE, "nvcr.io#nvidia/pytorch:25.01-py3 or /shared/images/llm.sqsh")
    if workdir and not _PATH.fullmatch(workdir):
        raise LaunchError(f"--container-workdir '{workdir}': give an absolute path (the repository inside the "
                          f"image; launch/container/Dockerfile puts it at {CONTAINER_REPO})", 2)
    return Container(image, parse_mounts(mounts) if mounts else (), workdir or CONTAINER_REPO)


def request(partition="", account="", time="", qos="", exclusive=False, nodelist="", exclude="", image="",
            mounts="", workdir="") -> SlurmRequest:
    """The checked request; LaunchError (exit 2) naming the flag and an accepted form."""
    return SlurmRequest(
        partition=_checked("--partition", partition, _NAME, "gpu"),
        account=_checked("--account", account, _NAME, "myproject"),
        time=_checked("--time", time, _TIME, "48:00:00, 2-00:00:00 or 90 (minutes)"),
        qos=_checked("--qos", qos, _NAME, "high"),
        exclusive=exclusive,
        nodelist=_checked("--nodelist", nodelist, _HOSTLIST, "gpu[001-004],gpu010"),
        exclude=_checked("--exclude", exclude, _HOSTLIST, "gpu[005-006]"),
        container=container_of(image, mounts, workdir))
