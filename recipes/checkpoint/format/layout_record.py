"""What a checkpoint tag records about the run that saved it, inside its complete.json (written with the marker, in
the same atomic write, so a tag is never complete without it):

  "layout": {"tp", "cp", "pp", "vpp", "dp", "ep", "zero_stage", "padded_vocab_size", "seq_length", "world_size",
             "schedule", "format"}  (format 2: every model-parallel rank's layers in its mp_rank file; a tag without
             it and with per-layer files was written by DeepSpeed's pipeline engine, recipes.checkpoint.format.layout)
  "model":  the fields that fix the parameters' names and shapes (num_layers, hidden_size, heads, ...)
  "recipe": {"name", "sha256"} of the recipe that saved it

`saved_layout` reads it back; a tag written before the record existed has its layout inferred from its DeepSpeed
files (`recipes.checkpoint.format.layout.detect_layout`: TP, PP, DeepSpeed's data axis DP x CP and the ZeRO stage;
the padded vocabulary and the sequence length are then unknown). JSON only here: the pre-launch checks read it
without importing torch; only the inference for an old tag loads a file (as data, recipes.checkpoint.safe_load).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from recipes.checkpoint.format.tags import MARKER

# 2: each model-parallel rank (stage x TP + TP rank) keeps its layers in mp_rank_MM_model_states.pt under their
# canonical names (the plain engine under a torch.distributed.pipelining schedule); before it, a pipeline checkpoint
# was DeepSpeed's PipelineModule format (one file per layer and TP rank).
FORMAT = 2

# The model fields that decide the parameters' names and shapes (a checkpoint's weights fit a model only if these
# agree). seq_length is not one of them with RoPE; position_embedding=learned makes it one (checked separately).
SHAPE_FIELDS = ("num_layers", "hidden_size", "num_attention_heads", "query_groups", "ffn_size", "vocab_size",
                "activation", "normalization", "tied_embeddings", "qkv_bias", "add_bias_linear", "position_embedding")


@dataclass(frozen=True)
class SavedLayout:
    tp: int
    cp: int
    pp: int
    dp: int
    zero_stage: int
    ep: int = 1
    vpp: int = 1  # model chunks per pipeline rank (which layers a rank's files hold)
    padded_vocab_size: int | None = None  # None: not recorded (a tag from before the record)
    seq_length: int | None = None
    recorded: bool = True  # False: inferred from the DeepSpeed files (cp then 1 and dp the data axis DP x CP)

    @property
    def data_axis(self) -> int:
        """DeepSpeed's data-parallel size, over which ZeRO partitions the optimizer state: DP x CP."""
        return self.dp * self.cp

    def record(self) -> dict:
        """As a checkpoint records it (None where unknown: a tag from before the record)."""
        return {f: getattr(self, f) for f in ("tp", "cp", "pp", "vpp", "dp", "ep", "zero_stage", "padded_vocab_size",
                                              "seq_length")}

    def describe(self) -> str:
        ep = f" x EP={self.ep}" if self.ep > 1 else ""
        ep += f" x VPP={self.vpp}" if self.vpp > 1 else ""
        if not self.recorded:
            return (f"TP={self.tp} x PP={self.pp} x DP x CP={self.dp}{ep}, ZeRO-{self.zero_stage} (inferred from its "
                    "files: it predates the layout record)")
        return (f"TP={self.tp} x CP={self.cp} x PP={self.pp} x DP={self.dp}{ep}, ZeRO-{self.zero_stage}, padded "
                f"vocabulary {self.padded_vocab_size}, seq_length {self.seq_length}")


def layout_of(recipe, layout) -> SavedLayout:
    """The layout `recipe` runs at (`layout`: its recipes.parallel.layout.Layout), as a checkpoint would record it."""
    return SavedLayout(tp=layout.tp, cp=layout.cp, pp=layout.pp, dp=layout.dp, zero_stage=layout.zero_stage,
                       ep=getattr(layout, "ep", 1), vpp=getattr(layout, "vpp", 1), padded_vocab_size=recipe.model.padded_vocab_size(layout.tp),
                       seq_length=recipe.model.seq_length)


def model_shape(model_cfg) -> dict:
    return {f: getattr(model_cfg, f) for f in SHAPE_FIELDS}


def record(recipe, layout) -> dict:
    """The entries a tag's complete.json gets (recipes.checkpoint.format.tags.mark_complete)."""
    from recipes.checkpoint.recipe_file import recipe_digest

    return {"layout": {**layout_of(recipe, layout).record(), "world_size": layout.world_size,
                       "schedule": getattr(layout, "schedule", "1f1b"), "format": FORMAT},
            "model": model_shape(recipe.model),
            "recipe": {"name": recipe.name, "sha256": recipe_digest(recipe)}}


def marker(tag_dir: Path) -> dict:
    try:
        return json.loads((Path(tag_dir) / MARKER).read_text())
    except (OSError, ValueError):
        return {}


def saved_layout(tag_dir: Path) -> SavedLayout:
    """The layout `tag_dir` was saved at: its record, else inferred from its files (a CheckpointError if neither)."""
    rec = marker(tag_dir).get("layout")
    if isinstance(rec, dict):
        return SavedLayout(tp=rec["tp"], cp=rec.get("cp", 1), pp=rec["pp"], dp=rec["dp"], ep=rec.get("ep", 1),
                           vpp=rec.get("vpp", 1), zero_stage=rec["zero_stage"], padded_vocab_size=rec.get("padded_vocab_size"),
                           seq_length=rec.get("seq_length"))
    from recipes.checkpoint.format.layout import detect_layout

    found = detect_layout(Path(tag_dir))
    return SavedLayout(tp=found.tp, cp=1, pp=found.pp, dp=found.dp, zero_stage=found.zero_stage, recorded=False)


def check_offline_readable(tag_dir: Path) -> None:
    """The offline readers (recipes.checkpoint.format.read, relayout.Source) know where DeepSpeed put every tensor
    except the experts of an expert-parallel run (in MoE param groups over the expert-data-parallel group): refuse
    those with the way that reads them."""
    from recipes.checkpoint.format.errors import CheckpointError

    ep = (marker(tag_dir).get("layout") or {}).get("ep", 1)
    if ep > 1:
        raise CheckpointError(f"{tag_dir} was saved at parallel.ep={ep} (experts split over EP ranks), which the "
                              "offline reader does not read; reshape it to ep=1 (python -m recipes reshape ... "
                              "--to ...,ep=1) or read it by engines (recipes.train.state_reader)")


def restamp(tag_dir: Path, entries: dict) -> None:
    """Replace record entries of a complete tag (atomically: the marker stays whole). For `recipes reshape`, whose
    writers lay a CP target out as DP x CP data ranks: the record then names the CP layout the run resumes at."""
    from data_prep.io import atomic_write

    data = marker(tag_dir)
    if not data:
        raise FileNotFoundError(f"{Path(tag_dir) / MARKER}: missing or unreadable")
    files = data.pop("files", {})
    atomic_write(str(Path(tag_dir) / MARKER), json.dumps({**data, **entries, "files": files}, indent=1))
