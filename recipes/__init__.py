"""LLM training recipes: a YAML recipe -> validated plan -> megatron-core x DeepSpeed run -> checkpoints -> HF.

Subpackages, lowest layer first (each imports only from the ones above it in this list; CI checks it):
  config      the recipe schema, loading (extends + overrides)
  model       model shape arithmetic (parameters, FLOPs) and the megatron-core layers
  parallel    the parallel Layout (the one validator of degrees), DeepSpeed JSON, pipeline partition
  planner     cost model, recipe validation, `plan` CLI
  checkpoint  save/resume with completion markers, reading any layout into a full state, TP shard rules
  train       engine (DeepSpeed + megatron-core groups), data, the loop, the `train` CLI, the full-state writer
  hf          Hugging Face conversion, export, import
  tools       demo, report, benchmarks, render, presets, reshape, measure_zero

Commands: `python -m recipes <command>` (or the `llm-recipes` console script); see `python -m recipes --help`.
"""

from recipes.config.logs import drop_library_noise
from recipes.torch_guard import guard_torch_on_import

# Checkpoints are data: torch.load of every process of the project, whoever calls it, is weights-only with an
# allow-list (recipes.torch_guard, recipes.checkpoint.safe_load), installed as soon as torch is imported.
guard_torch_on_import()

# Every process of the project imports this package before DeepSpeed: the ranks, the checkpoint writer processes they
# spawn (a spawned child does not re-run `python -m recipes`), evaluations, exports. So the filter of DeepSpeed's
# per-process "Setting accelerator to CPU" is set here, before DeepSpeed can log it (recipes.config.logs says why).
drop_library_noise()
