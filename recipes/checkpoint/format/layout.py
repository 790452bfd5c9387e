"""DeepSpeed's files inside one tag directory: their names, which layout (TP x PP x DP, ZeRO stage) they were saved
at, and reading one of them as data.

Where the tensors live:
  * ZeRO 0/1/2 (any PP): `mp_rank_MM_model_states.pt` ['module']: the layers model-parallel rank MM holds, under their
    canonical names (format 2, recipes.checkpoint.format.layout_record; a tied head's copy on the last stage is
    "0.word_embeddings.weight" again).
  * PP > 1 written by DeepSpeed's pipeline engine (before format 2, ZeRO 0/1): `layer_XX-model_TT-model_states.pt` per
    pipeline layer and TP rank, the tied embedding as `tied_modules.embed.*` (read here, never written).
  * ZeRO-3: weights only in the fp32 partitions of `zero_pp_rank_D_mp_rank_TT_optim_states.pt`.
  * ZeRO >= 1: fp32 master weights and Adam moments as flat per-DP-rank partitions in the optim files (prefixed
    `bf16_` by DeepSpeed's bf16 optimizer).
  * every file of a pipeline or ZeRO-1/2 save: `mp_rank_MM_model_states.pt` (client state, lr schedule, param_shapes).
The model-parallel rank MM of a file is `stage * TP + tp_rank` (DeepSpeed's grid, TP fastest).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from recipes.checkpoint import safe_load
from recipes.checkpoint.format.errors import CheckpointError

LAYER_FILE = re.compile(r"^layer_(\d+)-model_(\d+)-model_states\.pt$")
OPTIM_FILE = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
MP_FILE = re.compile(r"^mp_rank_(\d+)_model_states\.pt$")
Z3_MODEL_FILE = re.compile(r"^zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt$")


def model_states_name(mp: int) -> str:
    return f"mp_rank_{mp:02d}_model_states.pt"


def zero3_model_states_name(dp: int, mp: int) -> str:
    return f"zero_pp_rank_{dp}_mp_rank_{mp:02d}_model_states.pt"


def layer_name(layer: int, tp: int) -> str:
    return f"layer_{layer:02d}-model_{tp:02d}-model_states.pt"


def optim_file_name(dp: int, mp: int) -> str:
    """The name a ZeRO-1/2 optimizer partition is written under (fp32 / fp16 runs)."""
    return f"zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt"


def optim_name(tag_dir: Path, dp: int, mp: int) -> str:
    """The existing optimizer file of DP rank `dp`, model-parallel rank `mp` (with or without the bf16_ prefix)."""
    for prefix in ("", "bf16_"):
        name = prefix + optim_file_name(dp, mp)
        if (tag_dir / name).is_file():
            return name
    raise CheckpointError(f"{tag_dir}: optimizer partition of DP rank {dp}, model-parallel rank {mp} is missing")


def load(path: Path) -> dict:
    """One checkpoint file as data (recipes.checkpoint.safe_load), a CheckpointError naming it otherwise."""
    try:
        return safe_load.load(path)
    except safe_load.UnsafeCheckpointError as e:
        raise CheckpointError(str(e)) from None
    except Exception as e:  # truncated / corrupt files raise many different errors
        raise CheckpointError(f"{path}: cannot be read ({type(e).__name__}: {e}); the file is damaged, use another "
                              "tag with --tag") from e


@dataclass
class SourceLayout:
    tp: int
    pp: int
    dp: int
    zero_stage: int
    pipeline_files: bool  # per-layer files (DeepSpeed's PipelineModule, before format 2)
    vpp: int = 1

    def describe(self) -> str:
        vpp = f" x VPP={self.vpp}" if self.vpp > 1 else ""
        return f"TP={self.tp} x PP={self.pp}{vpp} x DP={self.dp}, ZeRO-{self.zero_stage}"

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp


def detect_layout(tag_dir: Path) -> SourceLayout:
    """The layout a tag was saved at, from its file names (and the first model-states file)."""
    names = [p.name for p in tag_dir.iterdir()]
    layer_tp = {int(m.group(2)) for n in names if (m := LAYER_FILE.match(n))}
    optim = [(int(m.group(1)), int(m.group(2))) for n in names if (m := OPTIM_FILE.match(n))]
    mp_files = sorted(int(m.group(1)) for n in names if (m := MP_FILE.match(n)))
    z3_files = [(int(m.group(1)), int(m.group(2))) for n in names if (m := Z3_MODEL_FILE.match(n))]
    if z3_files:
        tp = 1 + max(mp for _, mp in z3_files)
        dp = 1 + max(d for d, _ in z3_files)
        return SourceLayout(tp=tp, pp=1, dp=dp, zero_stage=3, pipeline_files=False)
    if not mp_files:
        raise CheckpointError(f"{tag_dir}: no DeepSpeed model-states files (mp_rank_*_model_states.pt); not a "
                              "DeepSpeed training checkpoint")
    first = load(tag_dir / model_states_name(0))
    zero_stage = 0
    if optim:
        o = load(tag_dir / optim_name(tag_dir, 0, 0))["optimizer_state_dict"]
        zero_stage = int(o.get("zero_stage", 1))
    dp = int(first.get("dp_world_size", 1 + max((d for d, _ in optim), default=0)))
    if layer_tp:
        dims = first.get("checkpoint_parallel_dimensions") or {}
        tp = int(dims.get("tp_degree", len(layer_tp)))
        pp = int(dims.get("pp_degree", len(mp_files) // tp))
        return SourceLayout(tp=tp, pp=pp, dp=dp, zero_stage=zero_stage, pipeline_files=True)
    # format 2: each of the TP x PP model-parallel ranks has its own mp_rank file; the record (else DeepSpeed's own
    # parallel dimensions in the file) says how TP and PP make them
    from recipes.checkpoint.format.layout_record import marker

    rec = marker(tag_dir).get("layout") or {}
    dims = first.get("checkpoint_parallel_dimensions") or {}  # DeepSpeed's engine records PP and TP in every file
    pp = int(rec.get("pp") or dims.get("pp_degree") or 1)
    return SourceLayout(tp=int(rec.get("tp") or dims.get("tp_degree") or len(mp_files) // pp), pp=pp, dp=dp,
                        zero_stage=zero_stage, pipeline_files=False, vpp=int(rec.get("vpp", 1)))
