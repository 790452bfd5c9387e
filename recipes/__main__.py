"""`python -m recipes <command> ...` (console script: `llm-recipes`): one entry for every recipes command.

Each command is a module with `main(argv)`; it is imported only when run, so `plan` never imports torch.
"""
from __future__ import annotations

import importlib
import sys

from recipes.config.cli_help import refuse

COMMANDS = {  # command -> (module, one line for --help)
    "train": ("recipes.train.cli", "train a recipe (under torchrun / deepspeed, or --local N CPU ranks)"),
    "plan": ("recipes.planner.cli", "rank parallel layouts for a model and cluster, explain the best"),
    "render": ("recipes.tools.render", "write a recipe's ds_config.json and resolved.yaml"),
    "presets": ("recipes.tools.presets", "list model and cluster presets with parameter counts"),
    "export-hf": ("recipes.hf.export", "checkpoint (any layout) -> Hugging Face model directory"),
    "import-hf": ("recipes.hf.importer", "Hugging Face model directory -> checkpoint at any layout"),
    "reshape": ("recipes.tools.reshape", "re-lay a checkpoint for another TP x PP x DP"),
    "bench-reshape": ("recipes.tools.bench_reshape", "peak memory and time of the streaming reshape, per checkpoint"),
    "bench-resume": ("recipes.tools.bench_resume", "time to resume at another layout (resharded) vs at the saved one"),
    "bench-checksums": ("recipes.tools.bench_checksums", "checkpoint write and read time with checksums vs without"),
    "demo": ("recipes.tools.demo", "the main job: corpus -> shards -> plan -> train -> export -> report"),
    "bench-train": ("recipes.tools.bench_train", "training throughput / MFU benchmark"),
    "bench-moe": ("recipes.tools.bench_moe", "step time of a dense model vs an MoE of the same active size"),
    "bench-plain": ("recipes.tools.bench_plain", "megatron-core layers vs a plain PyTorch model of the same shape"),
    "measure-zero": ("recipes.tools.measure_zero", "measure real ZeRO 0-3 model-state memory per rank"),
    "measure-save-stall": ("recipes.tools.measure_save_stall", "training stall per checkpoint save, sync vs async"),
    "report": ("recipes.tools.report", "rebuild a run's report.md and plots from its metrics"),
    "evaluate": ("recipes.tools.evaluate", "lm-evaluation-harness on an export or a checkpoint (local tasks)"),
}


def version() -> str:
    """The installed distribution's version (pyproject.toml's `version`, read from the install's metadata)."""
    from importlib.metadata import PackageNotFoundError, version as dist_version

    try:
        return f"llm-recipes {dist_version('llm-recipes')}"
    except PackageNotFoundError:
        return "llm-recipes (not installed: pip install -e . or launch/setup_env.sh)"


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: python -m recipes <command> [args...]   (or: llm-recipes <command> ...)", "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", "`python -m recipes <command> --help` for a command's options and examples; --version for the "
              "version."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(version())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        return refuse(f"unknown command '{name}'\n\n{usage()}")
    module = importlib.import_module(COMMANDS[name][0])
    return module.main(rest)


if __name__ == "__main__":
    sys.exit(main())
