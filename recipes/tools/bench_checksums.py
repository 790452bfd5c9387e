"""What the checkpoint checksums cost: writing a checkpoint file with its checksum computed on the way out vs without,
and reading it with the check before the load vs without, side by side in one run (alternating, `--repeat` times).

    python -m recipes bench-checksums [--mib 512] [--repeat 3] [--dir DIR]

The file is a torch.save of `--mib` MiB of float32 tensors (a model-states file's shape: a few hundred tensors),
written and fsynced in `--dir` (default: a temporary directory on the same file system as the current one, removed
afterwards). Reads come from the page cache (the file was just written): the worst case for the check's share, since a
read from a shared file system costs more and the check's cost stays the same.
"""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch

from data_prep.io import fsync_file, open_write
from recipes.checkpoint import safe_load
from recipes.checkpoint.format import checksums
from recipes.checkpoint.writer import write_durably
from recipes.config.cli_help import command_parser


def _state(mib: int) -> dict:
    n = mib * 2**20 // 4
    per = max(1, n // 256)
    torch.manual_seed(0)
    return {"module": {f"layers.{i}.weight": torch.randn(per) for i in range(n // per)}}


def _write_plain(state, path: Path) -> None:
    with open_write(str(path)) as f:
        torch.save(state, f)
        fsync_file(f)


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(mib: int, repeat: int, where: Path) -> dict:
    state = _state(mib)
    times = {"write": [], "write+checksum": [], "read": [], "check+read": []}
    plain, recorded = where / "plain.pt", where / "recorded.pt"
    for _ in range(repeat):
        times["write"].append(_timed(lambda: _write_plain(state, plain)))
        digests: dict[str, str] = {}
        times["write+checksum"].append(_timed(lambda: write_durably(state, recorded, digests=digests)))
        checksums.record(where, "bench", digests)
        times["read"].append(_timed(lambda: safe_load.load(plain)))  # no record for it: no check
        checksums.forget()  # each repeat checks again, as a new process would
        times["check+read"].append(_timed(lambda: safe_load.load(recorded)))
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv=None) -> int:
    p = command_parser("python -m recipes bench-checksums", __doc__)
    p.add_argument("--mib", type=int, default=512, help="size of the checkpoint file (MiB)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--dir", default=None, help="where to write (default: a temporary directory here)")
    ns = p.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=ns.dir or ".", prefix=".bench-checksums-") as tmp:
        t = measure(ns.mib, ns.repeat, Path(tmp))
    gib = ns.mib / 1024
    print(f"{ns.mib} MiB file, median of {ns.repeat}:")
    print(f"  write + fsync   {t['write']:.3f} s   with checksum {t['write+checksum']:.3f} s   "
          f"ratio {t['write+checksum'] / t['write']:.3f}   ({gib / t['write+checksum']:.2f} GiB/s)")
    print(f"  read (cached)   {t['read']:.3f} s   check + read  {t['check+read']:.3f} s   "
          f"ratio {t['check+read'] / t['read']:.3f}   ({gib / t['check+read']:.2f} GiB/s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
