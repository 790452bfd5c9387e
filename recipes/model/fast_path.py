"""The GPU fast path: what changes on CUDA, decided in one place, with the CPU path left exactly as it is.

* fusions (`fused_config_kwargs`): megatron-core's bias + activation (GeLU, SwiGLU) and bias + dropout + add fusions.
  Both are megatron-core's own `jit_fuser` (torch.compile) functions, so they need neither Transformer Engine nor
  apex. Norms are already torch's fused `F.rms_norm` / `F.layer_norm` (`recipes.model.layers.TorchNorm`);
  `persist_layer_norm` only selects apex's persistent LayerNorm kernel, so it stays off.
* attention backend (`check_attention_backend`): asks torch which SDPA kernel it would pick for the model's real
  shapes and dtype, says it, and refuses the math kernel (which stores the s x s scores) for bf16/fp16 at head dim
  <= 256 unless the recipe sets `training.allow_math_attention: true`.
* one fused non-finite check (`any_non_finite`): a max-|x| `torch._foreach_norm` per dtype group and one host sync,
  instead of one `isfinite().all()` (and one sync) per parameter.
* opt-in `torch.compile` of each decoder layer (`training.compile_decoder_layers`, default off).

DeepSpeed's overlap_comm / contiguous_gradients for GPU runs live in `recipes.parallel.ds_config.zero_comm_settings`, which
the planner reads too.
"""
from __future__ import annotations

import logging
from collections import defaultdict

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

MAX_FLASH_HEAD_DIM = 256  # flash / cuDNN / memory-efficient SDPA kernels handle head dims up to 256


def fusions_enabled(recipe) -> bool:
    """Fusions run where the model runs on CUDA (the same rule as `recipes.train.engine.pick_device`)."""
    return recipe.cluster.device == "cuda" and torch.cuda.is_available()


def fused_config_kwargs(model_cfg) -> dict:
    """TransformerConfig fields that turn megatron-core's fusions on for this model shape.

    GeLU: megatron-core's fused kernel is the tanh approximation (what the unfused path computes with
    `F.gelu(approximate="tanh")`), selected by `activation_func=F.gelu`; it needs a bias (megatron-core refuses
    the fusion for bias-free GeLU), so bias-free GeLU models keep the unfused activation.
    """
    kw = {"bias_dropout_fusion": True}
    if model_cfg.activation == "swiglu":
        kw.update(bias_activation_fusion=True, activation_func=F.silu)
    elif model_cfg.add_bias_linear:
        kw.update(bias_activation_fusion=True, activation_func=F.gelu)
    return kw


# ------------------------------------------------------------------------------------------------- attention
def sdpa_backend(head_dim: int, heads: int, groups: int, seq: int, dtype: torch.dtype, device: torch.device) -> str:
    """Name of the SDPA kernel torch picks for our call (`recipes.model.layers.SDPAttention`): same strides (a permuted
    [s, b, heads, d] tensor), causal, no mask, no dropout, GQA when groups < heads. The choice also honours the
    global `torch.backends.cuda.enable_*_sdp` switches, like the real call."""
    from torch.nn.attention import SDPBackend

    def t(n):
        return torch.empty(seq, 1, n, head_dim, dtype=dtype, device=device).permute(1, 2, 0, 3)

    q, k = t(heads), t(groups)
    choice = torch._fused_sdp_choice(q, k, k, None, 0.0, True, scale=None, enable_gqa=groups != heads)
    labels = {SDPBackend.FLASH_ATTENTION: "flash", SDPBackend.CUDNN_ATTENTION: "cudnn",
              SDPBackend.EFFICIENT_ATTENTION: "efficient", SDPBackend.MATH: "math"}
    return {int(k): v for k, v in labels.items()}.get(int(choice), f"none (SDPBackend {int(choice)})")


def attention_problem(backend: str, head_dim: int, dtype: torch.dtype, allow_math: bool) -> str | None:
    """Why this backend must not run silently (None = fine)."""
    if backend != "math" or allow_math or dtype not in (torch.bfloat16, torch.float16):
        return None
    if head_dim > MAX_FLASH_HEAD_DIM:
        return None  # no fused kernel exists for this head dim: math is the only choice
    return (f"torch SDPA would run the math attention kernel (stores the s x s scores: slow and memory-hungry) for "
            f"{str(dtype).removeprefix('torch.')} at head dim {head_dim}, where flash/cuDNN/efficient kernels "
            f"should apply. Check the GPU and torch build (torch.backends.cuda.flash_sdp_enabled(), "
            f"cudnn_sdp_enabled(), mem_efficient_sdp_enabled()), or set training.allow_math_attention=true to "
            f"run anyway")


def check_attention_backend(recipe, device: torch.device) -> str:
    """Say which SDPA kernel the model's attention runs on, and refuse a silent math fallback on CUDA."""
    m, tr = recipe.model, recipe.training
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(tr.precision, torch.float32)
    head_dim = m.kv_channels if m.mla is None else m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim
    tp = recipe.parallel.tp
    seq = min(m.seq_length, 8192)  # the kernel choice does not hinge on length; a 128k-token probe would cost a GB
    backend = sdpa_backend(head_dim, m.num_attention_heads // tp, m.query_groups // tp, seq, dtype, device)
    log.info("attention: torch SDPA %s kernel (%s, head dim %d, %s)", backend, dtype, head_dim, device)
    if device.type == "cuda":
        problem = attention_problem(backend, head_dim, dtype, tr.allow_math_attention)
        if problem:
            raise RuntimeError(problem)
    return backend


# ------------------------------------------------------------------------------------------------- non-finite check
@torch.no_grad()
def any_non_finite(tensors, device: torch.device) -> torch.Tensor:
    """[1.0] if any element of `tensors` is inf or NaN, else [0.0], a float32 tensor on `device` (no host sync).

    max |x| (the inf-norm) is inf or NaN exactly when a tensor holds an inf or NaN, and unlike the 2-norm it cannot
    overflow on finite values, so this says the same as `any(not isfinite(t).all())`. `_foreach_norm` takes one
    dtype per call on the fused CUDA path, hence the grouping.
    """
    groups = defaultdict(list)
    for t in tensors:
        groups[(t.device, t.dtype)].append(t)
    if not groups:
        return torch.zeros(1, device=device)
    norms = [n.float().to(device) for ts in groups.values() for n in torch._foreach_norm(ts, float("inf"))]
    return (~torch.isfinite(torch.stack(norms)).all()).float().reshape(1)


# ------------------------------------------------------------------------------------------------- torch.compile
def compile_decoder_layers(module: torch.nn.Module) -> int:
    """Compile each decoder layer's forward in place (parameter names and state dicts unchanged, unlike wrapping the
    module); returns how many were compiled."""
    from recipes.model.layers import DecoderLayerPipe

    n = 0
    for layer in module.modules():
        if isinstance(layer, DecoderLayerPipe):
            layer.compile()
            n += 1
    return n
