"""Parse, validate and narrow a DeepSpeed-style hostfile (`hostname slots=N`, `#` comments, blank lines).

The bash launchers call this once and read its plain output; it knows nothing of ssh or back ends.

    python launch/hostfile.py plan HOSTFILE [--include SPEC] [--exclude SPEC] [--num-nodes N] [--num-gpus N]

prints one selected node per line: `host slots devices` (devices = comma-separated slot indices), or exits 2 with
every problem found, each naming the file and line. SPEC follows DeepSpeed's --include/--exclude:
`host1@host2` (whole hosts) or `host1:0,1@host2` (slot indices on a host).
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

_LINE = re.compile(r"^(?P<host>[A-Za-z0-9_.\-\[\]:]+)(?:\s+slots\s*=\s*(?P<slots>\S+))?\s*$")


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="hostfile.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["plan"])
    ap.add_argument("hostfile")
    ap.add_argument("--include", default="")
    ap.add_argument("--exclude", default="")
    ap.add_argument("--num-nodes", type=int, default=0)
    ap.add_argument("--num-gpus", type=int, default=0)
    a = ap.parse_args(argv)
    try:
        nodes = select_nodes(parse_hostfile(a.hostfile), a.include, a.exclude, a.num_nodes, a.num_gpus)
    except HostfileError as e:
        print(f"hostfile error:\n{e}", file=sys.stderr)
        return 2
    for n in nodes:
        print(n.host, n.slots, ",".join(map(str, n.devices)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
