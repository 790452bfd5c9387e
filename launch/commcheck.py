"""All-reduce bandwidth check across every rank of a launch (nccl-tests style), run before a long job.

Started like the training entry (torchrun / DeepSpeed launcher / srun set RANK, WORLD_SIZE, MASTER_ADDR, ...), e.g.
    launch/preflight.sh RECIPE --hostfile hosts --comm-check
    launch/train.sh RECIPE --hostfile hosts --entry "python -m launch.commcheck"
Rank 0 prints, per message size: size, time per all-reduce, algbw = size / time and busbw = algbw * 2(n-1)/n (the
ring all-reduce's bytes on the busiest link, nccl-tests PERFORMANCE.md), and checks every result for correctness.
gloo on CPU, nccl when CUDA is available (LAUNCH_COMM_BACKEND overrides). --json writes the table for tools.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--min-bytes", type=int, default=1 << 10)
    ap.add_argument("--max-bytes", type=int, default=int(os.environ.get("COMMCHECK_MAX_BYTES", 1 << 22)))
    ap.add_argument("--factor", type=int, default=4, help="message size multiplier between rows")
    ap.add_argument("--iters", type=int, default=int(os.environ.get("COMMCHECK_ITERS", 10)))
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json", default=os.environ.get("COMMCHECK_JSON"), help="rank 0 writes the results here")
    ap.add_argument("--quiet", action="store_true", help="print only the summary line")
    ap.add_argument("--timeout-minutes", type=int, default=None,
                    help="give up on a collective after this long (default: the recipe's "
                         "training.dist_timeout_minutes with --config, else 5)")
    # Accepted so that commcheck runs wherever the training entry runs (launch/train.sh passes the recipe along).
    ap.add_argument("--config", default=None)
    ap.add_argument("--local_rank", "--local-rank", type=int, default=None)
    args, overrides = ap.parse_known_args(argv)
    if args.timeout_minutes is None:
        args.timeout_minutes = 5  # a check should fail fast, not wait torch's 30 min
        if args.config:
            from recipes.config.loading import load_recipe

            args.timeout_minutes = load_recipe(args.config, [o for o in overrides if "=" in o]
                                               ).training.dist_timeout_minutes
    return args


def bus_bandwidth(algbw: float, world: int) -> float:
    return algbw * 2 * (world - 1) / world


def _group_timeout_s(device) -> float | None:
    """The timeout the default group actually holds (read back, for --json)."""
    try:
        return dist.group.WORLD._get_backend(device).options._timeout.total_seconds()
    except (AttributeError, RuntimeError):
        return None


def gather_names(name: str, world: int, device) -> list[str]:
    """Every rank's name, as fixed-size byte tensors (no pickle crosses the unauthenticated rendezvous)."""
    raw = name.encode()[:255]
    mine = torch.zeros(256, dtype=torch.uint8)
    mine[:len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
    out = [torch.zeros(256, dtype=torch.uint8, device=device) for _ in range(world)]
    dist.all_gather(out, mine.to(device))
    return [bytes(t.cpu().tolist()).rstrip(b"\0").decode(errors="replace") for t in out]


def measure(nbytes: int, args, rank: int, world: int, device, sync_cuda: bool) -> dict:
    """One row: the slowest rank's mean time of an all-reduce of `nbytes`, its bandwidths, and whether every result
    was right on every rank."""
    count = max(1, nbytes // 4)
    buf = torch.empty(count, dtype=torch.float32, device=device)
    for _ in range(args.warmup):
        buf.fill_(1.0)
        dist.all_reduce(buf)
    times, ok = [], True
    for _ in range(args.iters):
        buf.fill_(float(rank + 1))
        dist.barrier()
        if sync_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        if sync_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        ok &= bool(torch.all(buf == world * (world + 1) / 2))
    t = torch.tensor([sum(times) / len(times)], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank defines the collective's time
    flag = torch.tensor([1 if ok else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    seconds, size = t.item(), count * 4
    algbw = size / seconds / 1e9
    return {"bytes": size, "count": count, "time_us": seconds * 1e6, "algbw_gbps": algbw,
            "busbw_gbps": bus_bandwidth(algbw, world), "ok": bool(flag.item())}


def main(argv=None) -> int:
    args = parse_args(argv)
    use_cuda = torch.cuda.is_available()
    backend = os.environ.get("LAUNCH_COMM_BACKEND") or ("nccl" if use_cuda else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        device = torch.device("cuda")
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
    dist.init_process_group(backend, timeout=timedelta(minutes=args.timeout_minutes))
    rank, world = dist.get_rank(), dist.get_world_size()
    host = os.environ.get("LAUNCH_HOST", os.uname().nodename)

    # Who is where: one line per rank on rank 0, so a missing node shows before any bandwidth number.
    hosts = gather_names(host, world, device)
    if rank == 0:
        print(f"commcheck: {world} ranks on {len(set(hosts))} host(s), backend {backend}, device {device.type}")
        print(f"{'size(B)':>12} {'count':>10} {'time(us)':>10} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12}  ok")
    rows, size = [], args.min_bytes
    while size <= args.max_bytes:
        row = measure(size, args, rank, world, device, use_cuda and backend == "nccl")
        rows.append(row)
        if rank == 0 and not args.quiet:
            print(f"{row['bytes']:>12} {row['count']:>10} {row['time_us']:>10.1f} {row['algbw_gbps']:>12.4f} "
                  f"{row['busbw_gbps']:>12.4f}  {'yes' if row['ok'] else 'NO'}", flush=True)
        size *= args.factor
    all_ok = all(r["ok"] for r in rows)
    if rank == 0:
        peak = max(r["busbw_gbps"] for r in rows)
        print(f"commcheck: peak busbw {peak:.4f} GB/s over {world} ranks; results {'correct' if all_ok else 'WRONG'}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"world_size": world, "backend": backend, "hosts": hosts, "rows": rows,
                           "timeout_s": _group_timeout_s(device)}, f, indent=1)
    dist.destroy_process_group()
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
