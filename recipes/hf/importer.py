"""Import a Hugging Face transformers Llama-style model directory (Llama 1/2/3.x, Qwen2, Mistral; Mixtral, Qwen2-MoE,
Qwen3-MoE; DeepSeek-V3 with its MTP depths) as a training checkpoint at a chosen layout, for continued pretraining (step 0, fresh optimizer, the model's weights).

    python -m recipes import-hf --hf HF_DIR --out CKPT_DIR --config RECIPE [parallel.tp=2 parallel.pp=2 ...]
    python -m recipes train --config RECIPE --local N ... checkpoint.dir=CKPT_DIR   # same overrides

The recipe supplies training, data and layout (parallel.tp/pp and dp, default dp=1); its model section is replaced
by the transformers config's architecture (layers, sizes, heads, query groups, vocabulary, RoPE base and llama3
scaling, epsilon, tying, biases), so check seq_length (a Mistral/Qwen2 sliding window must be >= it). The
checkpoint is written by an engine at that layout (one CPU process per rank) with DeepSpeed's own save, plus
CKPT_DIR/recipe.yaml (the merged recipe, for `recipes train --config` and export).
"""
from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path

from recipes.config.logs import setup_logging
from recipes.config.loading import RecipeError, load_recipe
from recipes.config.cli_help import command_parser, refuse
from recipes.train.local_workers import cpu_only_workers

log = logging.getLogger(__name__)


def check_hf_dir(hf_dir: str) -> None:
    """A local transformers model directory, or one line saying what it is instead (transformers would call a missing
    local path a malformed hub repo id: nothing is downloaded here)."""
    p = Path(hf_dir)
    if not p.exists():
        raise FileNotFoundError(f"--hf {hf_dir}: no such directory; give a local transformers model directory (the "
                                "config.json and weights save_pretrained writes; nothing is downloaded)")
    if not p.is_dir():
        raise NotADirectoryError(f"--hf {hf_dir} is a file; give the model's directory (holding config.json and the "
                                 "weights)")
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"--hf {hf_dir} has no config.json: not a transformers model directory (give the "
                                "directory save_pretrained wrote)")


def check_out_dir(out_dir: str) -> None:
    """--out must be a new or empty directory: an import never writes over anything."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {out} is a file; give a new directory for the checkpoint")
    if out.is_dir() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty; remove it or choose another --out")


def hf_recipe(hf_dir: str, config: str, overrides: list[str]):
    from transformers import AutoConfig

    from recipes.hf.convert import check_sliding_window, model_fields_from_hf_config

    check_hf_dir(hf_dir)
    cfg = AutoConfig.from_pretrained(hf_dir, local_files_only=True)
    fields = model_fields_from_hf_config(cfg, hf_dir)
    model_overrides = []
    for k, v in fields.items():
        if isinstance(v, dict):  # a sub-section (rope_scaling, moe): key by key
            model_overrides += [f"model.{k}.{kk}={'' if vv is None else vv}" for kk, vv in v.items()]
        else:
            model_overrides.append(f"model.{k}={'' if v is None else v}")  # empty = None (also over the recipe's)
    # the checkpoint's tokenizer travels to the export: sentencepiece (Llama 1/2, Mistral) or tokenizer.json (Llama 3,
    # Qwen2: the directory, so that its tokenizer_config.json with the special tokens comes along)
    tok = Path(hf_dir) / "tokenizer.model"
    extra = []
    if tok.is_file():
        extra = [f"data.tokenizer={tok.resolve()}"]
    elif (Path(hf_dir) / "tokenizer.json").is_file():
        extra = [f"data.tokenizer={Path(hf_dir).resolve()}"]
    recipe = load_recipe(config, [*model_overrides, *extra, *overrides])
    check_sliding_window(cfg, recipe.model.seq_length)
    if recipe.parallel.dp is None:
        recipe.parallel.dp = 1
    return recipe, cfg


def import_hf(hf_dir: str, out_dir: str, recipe, quiet: bool = False) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    from recipes.train.state_writer import publish_checkpoint
    from recipes.train.cli import validate_recipe

    p = recipe.parallel
    world = p.tp * p.cp * p.pp * p.dp  # CP ranks write their DP x CP share of the optimizer like DP ranks
    validate_recipe(recipe, world)
    out = Path(out_dir)
    check_out_dir(out_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    weights = hf_weights(hf_dir, model.state_dict(), recipe.model)
    del model
    meta = {"client_state": {"step": 0, "consumed_samples": 0, "nan_skips_total": 0},
            "source": str(Path(hf_dir).resolve())}
    log.info(f"import: {hf_dir} -> TP={p.tp} x PP={p.pp} x DP={p.dp}, ZeRO-{p.zero_stage}; writing with {world} processes")
    publish_checkpoint(out, world, weights, meta, recipe, quiet=quiet)
    log.info(f"import: wrote {out}; continue pretraining with python -m recipes train --config {out}/recipe.yaml "
        f"--local {world} (or your launcher) checkpoint.dir={out}")
    return out


def hf_weights(hf_dir: str, hf_state: dict, m) -> dict:
    """Canonical full weights of a transformers model's state dict (and, for DeepSeek-V3, its MTP depths, which
    transformers does not load: read from the directory's safetensors files)."""
    if m.mla is not None:
        from recipes.hf.deepseek import depth_tensors, from_deepseek

        return from_deepseek({**hf_state, **depth_tensors(hf_dir, m.num_layers, m.mtp_depths)}, m)
    from recipes.hf.convert import from_llama

    return from_llama(hf_state, m)


def main(argv: list[str] | None = None) -> int:
    ap = command_parser("python -m recipes import-hf", __doc__)
    ap.add_argument("--hf", required=True, help="transformers model directory (Llama, Qwen2, Mistral, Mixtral, "
                    "Qwen2-MoE, Qwen3-MoE or DeepSeek-V3)")
    ap.add_argument("--out", required=True, help="training checkpoint directory to create")
    ap.add_argument("--config", required=True, help="recipe for training/data/layout (model comes from --hf)")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("overrides", nargs="*", help="section.key=value, e.g. parallel.tp=2 parallel.pp=2 parallel.dp=1")
    ns = ap.parse_args(argv)
    cpu_only_workers()  # its engine ranks run on CPU: forked from here when no GPU is visible (local_workers)
    setup_logging(quiet=ns.quiet)
    warnings.filterwarnings("ignore", message=r".*(Apex|Transformer Engine).* not installed")
    from recipes.hf.convert import UnsupportedModel

    # absolute: the writer ranks run in the repository (recipes.train.local_workers), not in the caller's directory
    ns.hf, ns.out = os.path.abspath(ns.hf), os.path.abspath(ns.out)
    try:
        check_out_dir(ns.out)  # before the model's config is read
        recipe, _ = hf_recipe(ns.hf, ns.config, ns.overrides)
        import_hf(ns.hf, ns.out, recipe, quiet=ns.quiet)
    except (RecipeError, UnsupportedModel, OSError, RuntimeError, ValueError) as e:
        return refuse(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
