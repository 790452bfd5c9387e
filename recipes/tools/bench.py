"""`python -m recipes bench <name> ...`: the benchmarks and measurements, one command group. Each prints its figures
side by side with its baseline, measured in the same run; docs/benchmarks.md lists the current figures and the
command line that reproduced each.
"""
from __future__ import annotations

import importlib

from recipes.config.cli_help import refuse

BENCHMARKS = {  # name -> (module, one line for --help)
    "train": ("recipes.tools.bench_train", "training throughput and MFU of a recipe"),
    "plain": ("recipes.tools.bench_plain", "megatron-core layers vs a plain PyTorch model of the same shape"),
    "moe": ("recipes.tools.bench_moe", "step time of a dense model vs an MoE of the same active size"),
    "reshape": ("recipes.tools.bench_reshape", "peak memory and time of the streaming reshape, per checkpoint"),
    "resume": ("recipes.tools.bench_resume", "time to resume at another layout (resharded) vs at the saved one"),
    "checksums": ("recipes.tools.bench_checksums", "checkpoint write and read time with checksums vs without"),
    "save-stall": ("recipes.tools.measure_save_stall", "training stall per checkpoint save, sync vs async"),
    "zero-memory": ("recipes.tools.measure_zero", "real ZeRO 0-3 model-state memory per rank vs the planner's"),
}


def usage() -> str:
    width = max(map(len, BENCHMARKS))
    lines = [f"  {name:<{width}}  {help_}" for name, (_, help_) in BENCHMARKS.items()]
    return "usage: python -m recipes bench <name> [options]   (<name> --help for its options)\n\nbenchmarks:\n" + \
        "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in BENCHMARKS:
        return refuse(f"unknown benchmark '{name}'\n\n{usage()}")
    return importlib.import_module(BENCHMARKS[name][0]).main(rest)
