"""Parse, validate and narrow a DeepSpeed-style hostfile (`hostname slots=N`, `#` comments, blank lines), and the
rule a host name must keep wherever the launcher meets one (a heartbeat, an exit record, the run directory).

Every problem is reported at once, each naming the file and line. --include / --exclude follow DeepSpeed's syntax:
`host1@host2` (whole hosts) or `host1:0,1@host2` (slot indices on a host). It knows nothing of ssh or back ends.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

_HOST = r"[A-Za-z0-9_.\-\[\]:]+"
_LINE = re.compile(rf"^(?P<host>{_HOST})(?:\s+slots\s*=\s*(?P<slots>\S+))?\s*$")


def valid_host(name: object) -> bool:
    """A host name as a hostfile may write it: letters, digits and `_.-[]:`, not starting with '-' (ssh and pdsh
    would read that as an option, e.g. -oProxyCommand=...)."""
    return isinstance(name, str) and re.fullmatch(_HOST, name) is not None and not name.startswith("-")


class HostfileError(ValueError):
    """A problem with the hostfile or the selection a user can fix; the message says where and how."""


@dataclass
class Node:
    host: str
    slots: int
    devices: list[int] = field(default_factory=list)

    def __post_init__(self):
        if not self.devices:
            self.devices = list(range(self.slots))


def parse_hostfile(path: str | Path) -> list[Node]:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise HostfileError(f"{path}: hostfile not found (pass --hostfile with lines like 'node1 slots=8')") from None
    except IsADirectoryError:
        raise HostfileError(f"{path} is a directory, not a hostfile: pass --hostfile FILE, a file with lines like "
                            "'node1 slots=8'") from None
    except (OSError, UnicodeDecodeError) as e:
        raise HostfileError(f"{path}: the hostfile cannot be read ({getattr(e, 'strerror', None) or e}): pass "
                            "--hostfile FILE, a text file with lines like 'node1 slots=8'") from None
    problems: list[str] = []
    nodes: list[Node] = []
    seen: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _LINE.match(line)
        if not m:
            problems.append(f"{path}:{lineno}: cannot read '{raw.strip()}'; expected 'hostname slots=N'")
            continue
        host, slots_text = m["host"], m["slots"]
        if host.startswith("-"):  # ssh / pdsh would read it as an option (e.g. -oProxyCommand=...)
            problems.append(f"{path}:{lineno}: host name '{host}' starts with '-'; host names cannot (ssh would take "
                            "it as an option): fix the name")
            continue
        if slots_text is None:
            problems.append(f"{path}:{lineno}: '{host}' has no slot count; write '{host} slots=N' (N = GPUs on it)")
            continue
        if not slots_text.isdigit():
            problems.append(f"{path}:{lineno}: slots='{slots_text}' for '{host}' is not a whole number")
            continue
        slots = int(slots_text)
        if slots == 0:
            problems.append(f"{path}:{lineno}: '{host}' has slots=0; remove the line or give it its GPU count")
            continue
        if host in seen:
            problems.append(
                f"{path}:{lineno}: '{host}' is listed again (first on line {seen[host]}); keep one line per host"
            )
            continue
        seen[host] = lineno
        nodes.append(Node(host, slots))
    if not nodes and not problems:
        problems.append(f"{path}: no hosts in the hostfile; add lines like 'node1 slots=8'")
    if problems:
        raise HostfileError("\n".join(problems))
    return nodes


def _parse_spec(spec: str, known: dict[str, Node], flag: str) -> dict[str, list[int] | None]:
    """`host1:0,1@host2` -> {host1: [0, 1], host2: None}; None means the whole host."""
    out: dict[str, list[int] | None] = {}
    for part in filter(None, (p.strip() for p in re.split(r"[@ ]", spec))):
        host, _, slots = part.partition(":")
        if host not in known:
            raise HostfileError(f"{flag} names '{host}', which is not in the hostfile (hosts: {', '.join(known)})")
        if not slots:
            out[host] = None
            continue
        try:
            idx = sorted({int(s) for s in slots.split(",") if s})
        except ValueError:
            raise HostfileError(f"{flag} '{part}': slot indices must be numbers, e.g. {host}:0,1") from None
        bad = [i for i in idx if not 0 <= i < known[host].slots]
        if bad:
            raise HostfileError(
                f"{flag} '{part}': slot(s) {bad} out of range; '{host}' has slots 0..{known[host].slots - 1}"
            )
        out[host] = idx
    return out


def select_nodes(nodes: list[Node], include: str = "", exclude: str = "", num_nodes: int = 0,
                 num_gpus: int = 0) -> list[Node]:
    """Apply --include / --exclude (DeepSpeed syntax), then keep the first num_nodes hosts and num_gpus slots each."""
    if include and exclude:
        raise HostfileError("use --include or --exclude, not both")
    known = {n.host: n for n in nodes}
    selected = [Node(n.host, n.slots, list(n.devices)) for n in nodes]
    if include:
        spec = _parse_spec(include, known, "--include")
        selected = [Node(h, len(d) if d else known[h].slots, d or list(known[h].devices)) for h, d in spec.items()]
    elif exclude:
        spec = _parse_spec(exclude, known, "--exclude")
        kept = []
        for n in selected:
            if n.host in spec:
                if spec[n.host] is None:
                    continue
                n.devices = [d for d in n.devices if d not in spec[n.host]]
                n.slots = len(n.devices)
                if not n.slots:
                    continue
            kept.append(n)
        selected = kept
    if num_nodes:
        if num_nodes > len(selected):
            raise HostfileError(f"--num-nodes {num_nodes} but only {len(selected)} host(s) selected")
        selected = selected[:num_nodes]
    if num_gpus:
        short = [n.host for n in selected if n.slots < num_gpus]
        if short:
            raise HostfileError(f"--num-gpus {num_gpus} but {', '.join(short)} has fewer slots")
        for n in selected:
            n.devices = n.devices[:num_gpus]
            n.slots = num_gpus
    if not selected:
        raise HostfileError("the --include/--exclude selection leaves no hosts")
    return selected
