"""Export a training checkpoint (any TP x PP x DP, any ZeRO stage; experts at any EP) to a Hugging Face transformers
model directory (Llama, Qwen2, GPT-2; Mixtral, Qwen2-MoE, Qwen3-MoE; DeepSeek-V3, its MTP depths in DeepSeek's layout).

    python -m recipes export-hf --checkpoint CKPT_DIR [--tag global_stepN] --out HF_DIR \
        [--config RECIPE [section.key=value ...]]

The recipe is `--config` (+ the overrides the run used), else CKPT_DIR/recipe.yaml (written by import_hf / reshape).
Writes config.json, model.safetensors, generation_config.json, the tokenizer (sentencepiece .model from
data.tokenizer or the first manifest's tokenizer.path -> tokenizer.json + tokenizer.model) and
export_info.json, into a temporary sibling directory renamed to HF_DIR only when complete.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

from recipes.checkpoint.recipe_file import load_checkpoint_recipe
from recipes.config import file_mode
from recipes.config.loading import RecipeError
from recipes.config.logs import setup_logging
from recipes.config.cli_help import command_parser, refuse
from recipes.train.local_workers import cpu_only_workers

log = logging.getLogger(__name__)

DOCUMENT_MASK_NOTE = (
    "trained with model.document_mask: packed samples attended only within each document and position ids restarted "
    "after each EOD. transformers has no packed-sample masking: feed one document per sequence (or pass your own "
    "attention mask and position_ids) to see the model as it was trained.")


def tokenizer_source(recipe) -> Path | None:
    """The sentencepiece model of the run: data.tokenizer, else the first manifest's (data's, then the stages')
    tokenizer.path."""
    if recipe.data.tokenizer:
        return Path(recipe.data.tokenizer)
    for m in recipe.data.manifests + [m for stage in recipe.data.stages for m in stage.manifests]:
        path = Path(m) / "manifest.json" if Path(m).is_dir() else Path(m)
        if path.is_file():
            tok = json.loads(path.read_text()).get("tokenizer") or {}
            if tok.get("path"):
                return Path(tok["path"])
    return None


def _hf_tokenizer(src: Path):
    """A transformers directory (tokenizer.json inside) or a bare tokenizer.json, e.g. an imported Llama 3 / Qwen2."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if src.is_dir():
        return AutoTokenizer.from_pretrained(str(src), local_files_only=True)
    return PreTrainedTokenizerFast(tokenizer_file=str(src))


def special_ids(sp_model: Path | None) -> dict:
    if sp_model is None:
        return {}
    if sp_model.suffix != ".model":
        tok = _hf_tokenizer(sp_model)
        return {"bos": tok.bos_token_id, "eos": tok.eos_token_id, "pad": tok.pad_token_id}
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(sp_model))
    return {k: (i if i >= 0 else None) for k, i in (("bos", sp.bos_id()), ("eos", sp.eos_id()), ("pad", sp.pad_id()))}


def write_tokenizer(sp_model: Path, out: Path) -> None:
    """sentencepiece .model -> a transformers fast tokenizer (tokenizer.json) that encodes exactly like sentencepiece;
    a transformers tokenizer (directory or tokenizer.json, e.g. from an imported Llama 3 / Qwen2) is saved unchanged.

    transformers converts the .model (its LlamaTokenizer conversion: BPE pieces, merges, byte fallback); its
    Metaspace pre-tokenizer skips sentencepiece's dummy prefix when a text already starts with a space, so the
    prefix is applied as sentencepiece does (always) by a Prepend + Replace normalizer, and the result is saved as a
    plain PreTrainedTokenizerFast (LlamaTokenizer would rebuild the pre-tokenizer when loaded).
    """
    if sp_model.is_dir() or sp_model.suffix == ".json":  # already a transformers tokenizer: saved as it is
        _hf_tokenizer(sp_model).save_pretrained(str(out))
        return
    if sp_model.suffix != ".model":
        raise RecipeError(f"tokenizer {sp_model}: export takes a sentencepiece .model, a tokenizer.json or a "
                          "transformers directory; set data.tokenizer")
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import normalizers
    from transformers import LlamaTokenizer, PreTrainedTokenizerFast

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(sp_model.read_bytes())
    norm = proto.normalizer_spec
    if norm.name != "identity" or norm.remove_extra_whitespaces:
        warnings.warn(f"{sp_model}: normalization '{norm.name}' (remove_extra_whitespaces="
                      f"{norm.remove_extra_whitespaces}) is not reproduced by the exported tokenizer; texts that "
                      "this normalization changes may encode differently in transformers")
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(sp_model, Path(tmp) / "tokenizer.model")
        converted = LlamaTokenizer.from_pretrained(tmp, add_bos_token=False, add_eos_token=False, legacy=False)
    backend = converted.backend_tokenizer
    steps = ([normalizers.Prepend("▁")] if norm.add_dummy_prefix else []) + [normalizers.Replace(" ", "▁")]
    backend.normalizer = normalizers.Sequence(steps)
    backend.pre_tokenizer = None
    sp = spm.SentencePieceProcessor(model_file=str(sp_model))

    def piece(i):
        return sp.id_to_piece(i) if i >= 0 else None

    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=piece(sp.bos_id()), eos_token=piece(sp.eos_id()),
                                  unk_token=piece(sp.unk_id()), pad_token=piece(sp.pad_id()),
                                  clean_up_tokenization_spaces=False)
    tok.save_pretrained(str(out))
    shutil.copy(sp_model, out / "tokenizer.model")


def hf_tensors(weights: dict, m, tokenizer_ids: dict) -> tuple:
    """(transformers config, the tensors its class holds, model.mtp's depths, which it does not: DeepSeek's layout
    next to them, recipes.hf.deepseek)."""
    from recipes.hf.convert import to_hf

    config, hf_state = to_hf(weights, m, tokenizer_ids)
    if m.mtp is None:
        return config, hf_state, {}
    from recipes.hf.deepseek import split_depths

    return (config, *split_depths(hf_state, m))


def export(ckpt_dir: str, out_dir: str, recipe, tag: str | None = None) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    from recipes.checkpoint.format.read import read_full_state
    from recipes.hf.convert import family
    from recipes.hf.deepseek import write_depths

    family(recipe.model)  # refuse unsupported architectures before reading anything
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty; remove it or choose another --out")
    if recipe.model.moe is not None:  # experts split over EP ranks: read through engines at the checkpoint's layout
        from recipes.train.state_reader import read_full_weights

        state = read_full_weights(ckpt_dir, recipe, tag=tag)
    else:
        state = read_full_state(ckpt_dir, recipe.model, tag=tag)
    sp_model = tokenizer_source(recipe)
    if sp_model is not None and not sp_model.exists():
        raise FileNotFoundError(f"tokenizer {sp_model} (from data.tokenizer or the manifest) does not exist; set "
                                "data.tokenizer=PATH to the sentencepiece .model")
    config, hf_state, depths = hf_tensors(state.weights, recipe.model, special_ids(sp_model))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        if recipe.model.tied_embeddings:
            hf_state["lm_head.weight"] = hf_state[next(k for k in hf_state if k.endswith(("embed_tokens.weight",
                                                                                          "wte.weight")))]
        model.load_state_dict(hf_state, strict=True, assign=True)
        model.tie_weights()
        model.generation_config.do_sample = False
        model.save_pretrained(str(tmp))
        if depths:  # DeepSeek-V3's MTP depths, which the transformers class does not hold
            write_depths(tmp, depths)
        if sp_model is not None:
            write_tokenizer(sp_model, tmp)
        else:
            log.warning("export: no sentencepiece tokenizer in data.tokenizer or the manifest; exported without one")
        info = {"source": str(Path(ckpt_dir).resolve()), "tag": state.meta["tag"],
                "source_layout": state.meta["source_layout"], "client_state": state.meta["client_state"],
                "architecture": config.architectures[0], "tokenizer": str(sp_model) if sp_model else None,
                "recipe": recipe.model_dump(mode="json"), "document_mask": recipe.model.document_mask}
        if recipe.model.document_mask:
            info["document_mask_note"] = DOCUMENT_MASK_NOTE
        (tmp / "export_info.json").write_text(json.dumps(info, indent=1))
        file_mode.fix_tree(tmp, file_mode.recipe_mode(recipe))  # checkpoint.file_mode (tmp itself is mkdtemp's 0700)
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info(f"export: wrote {config.architectures[0]} to {out} ({sum(v.numel() for v in hf_state.values()):,} "
        f"tensor elements, step {state.meta['client_state'].get('step')})")
    return out


EXAMPLES = (  # shown by --help
    "python -m recipes export-hf --checkpoint runs/tiny --out runs/tiny-hf   # the newest complete checkpoint",
    "python -m recipes export-hf --checkpoint /shared/ckpt/run1 --tag global_step20000 --out /shared/hf/run1-20k",
)


def main(argv: list[str] | None = None) -> int:
    ap = command_parser("python -m recipes export-hf", __doc__, EXAMPLES)
    ap.add_argument("--checkpoint", required=True, help="training checkpoint directory (checkpoint.dir)")
    ap.add_argument("--tag", help="global_stepN (default: the `latest` file)")
    ap.add_argument("--out", required=True, help="transformers model directory to create")
    ap.add_argument("--config", help="the run's recipe (default: CHECKPOINT/recipe.yaml)")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("overrides", nargs="*", help="section.key=value overrides the run used")
    ns = ap.parse_args(argv)
    cpu_only_workers()  # its engine ranks run on CPU: forked from here when no GPU is visible (local_workers)
    warnings.filterwarnings("ignore", message=r".*(Apex|Transformer Engine).* not installed")
    from recipes.checkpoint.format.errors import CheckpointError
    from recipes.hf.convert import UnsupportedModel

    setup_logging(quiet=ns.quiet)
    if ns.quiet:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    try:
        recipe = load_checkpoint_recipe(ns.checkpoint, ns.config, ns.overrides)
        file_mode.apply_recipe_mode(recipe)
        export(ns.checkpoint, ns.out, recipe, tag=ns.tag)
    except (RecipeError, CheckpointError, UnsupportedModel, FileExistsError, FileNotFoundError) as e:
        return refuse(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
