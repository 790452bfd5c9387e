"""Decoder-only transformer from megatron-core tensor-parallel pieces, as numbered pipeline layers.

One model, one container: `DecoderStack` holds the layers a rank owns as children named by their index, so parameter
names are the same at every layout. PP = 1: all of them (`PlainDecoder`); PP > 1: the layers of the rank's chunks
(recipes.parallel.partition), each chunk a `StageChunk` that torch.distributed.pipelining runs
(recipes.parallel.pipeline):

  index 0          embedding       `EmbeddingPipe`
  index 1 .. L     decoder layers  `DecoderLayerPipe` (megatron-core `TransformerLayer` from a local ModuleSpec)
  index L+1        final norm      `FinalNormPipe`
  index L+2        output head     `OutputHeadPipe` (untied); a tied head reuses layer 0's word embedding, and in a
                   pipeline the last rank holds a copy of it under the same name ("0.word_embeddings.weight",
                   `TiedHeadCopy`), kept equal by summing the two copies' gradients (recipes.parallel.pipeline)

Parameters (names inside one pipeline layer; h hidden, V padded vocab, a heads, g query groups, d = h / a head dim,
f ffn size; "TP dim" is the dimension split over tensor-parallel ranks, "-" = replicated):

  | layer    | name                                   | full shape                  | TP dim |
  |----------|----------------------------------------|-----------------------------|--------|
  | embed    | word_embeddings.weight                 | [V, h]                      | 0      |
  | embed    | position_embeddings.weight (learned)   | [s, h]                      | -      |
  | decoder  | input_layernorm.weight (.bias if LN)   | [h]                         | -      |
  | decoder  | self_attention.linear_qkv.weight       | [(a + 2g) d, h]             | 0      |
  | decoder  | self_attention.linear_qkv.bias (qkv b.)| [(a + 2g) d]                | 0      |
  | decoder  | self_attention.linear_proj.weight      | [h, a d]                    | 1      |
  | decoder  | self_attention.linear_proj.bias (bias) | [h]                         | -      |
  | decoder  | pre_mlp_layernorm.weight (.bias if LN) | [h]                         | -      |
  | decoder  | mlp.linear_fc1.weight                  | [2f, h] swiglu / [f, h] gelu| 0      |
  | decoder  | mlp.linear_fc1.bias (bias)             | [2f] / [f]                  | 0      |
  | decoder  | mlp.linear_fc2.weight                  | [h, f]                      | 1      |
  | decoder  | mlp.linear_fc2.bias (bias)             | [h]                         | -      |
  | norm     | norm.weight (.bias if LN)              | [h]                         | -      |
  | head     | output_layer.weight (untied only)      | [V, h]                      | 0      |

"(bias)" = add_bias_linear; the qkv bias also exists with add_qkv_bias alone (Qwen2).

Layouts inside the fused tensors (megatron-core conventions, needed by HF export):
  * linear_qkv rows are grouped per query group: for each of the g groups, (a/g) query heads, then 1 key head, then
    1 value head, each d rows. A TP shard holds g/t whole groups.
  * linear_fc1 (swiglu) is [gate; up] per TP shard: each TP rank's shard is its gate slice followed by its up slice,
    so the full tensor is [gate_0; up_0; gate_1; up_1; ...] over TP ranks (use `swiglu_fc1_full_order`).
  * RoPE rotates halves (the HF Llama `rotate_half` convention), not interleaved pairs.
  * The vocabulary is padded to V = `model.padded_vocab_size(tp)`; padded logits are masked out of the loss, padded
    embedding rows start at zero.

Initialisation does not depend on the layout: weights are created full-size on CPU (`use_cpu_initialization`) and
each pipeline layer draws from its own seed (training.seed + layer index), so any TP x PP gives the same full weights.
"""
from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from data_prep.lazy_compile import import_with_compile_deferred

import_with_compile_deferred(("megatron.core",))  # its fusions compiled at their first call, not at this import
from megatron.core import parallel_state, tensor_parallel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_layer import TransformerLayer
from megatron.core.transformer.transformer_config import TransformerConfig

from recipes.model import context


SEED_STRIDE = 1009  # layer i draws from seed + SEED_STRIDE * i


# ----------------------------------------------------------------------------------------------------------- config
def transformer_config(model_cfg, tp: int, sequence_parallel: bool = False, fused: bool = False,
                       ep: int = 1) -> TransformerConfig:
    """megatron-core TransformerConfig for a recipe's model section at tensor-parallel degree `tp` (and expert-
    parallel degree `ep` for model.moe, see recipes.model.moe).

    Pipeline parallelism is the schedule's job (recipes.parallel.pipeline), so megatron-core's layers see pipeline
    size 1. Fusions are off unless `fused`
    (CUDA runs, see `recipes.model.fast_path`): they compile kernels, which costs minutes on CPU for no gain; torch SDPA
    gives the attention speed on GPU.
    """
    swiglu = model_cfg.activation == "swiglu"
    kwargs = dict(
        num_layers=model_cfg.num_layers,
        hidden_size=model_cfg.hidden_size,
        num_attention_heads=model_cfg.num_attention_heads,
        num_query_groups=model_cfg.query_groups,
        ffn_hidden_size=model_cfg.ffn_size,
        kv_channels=model_cfg.kv_channels,
        qk_layernorm=model_cfg.qk_norm,
        tensor_model_parallel_size=tp,
        sequence_parallel=sequence_parallel and tp > 1,
        normalization="RMSNorm" if model_cfg.normalization == "rmsnorm" else "LayerNorm",
        layernorm_epsilon=model_cfg.norm_epsilon,
        gated_linear_unit=swiglu,
        activation_func=F.silu if swiglu else partial(F.gelu, approximate="tanh"),
        add_bias_linear=model_cfg.add_bias_linear,
        add_qkv_bias=model_cfg.add_qkv_bias,  # megatron-core: qkv bias = add_bias_linear or add_qkv_bias
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=model_cfg.init_method_std,
        use_cpu_initialization=True,
        perform_initialization=True,
        params_dtype=torch.float32,  # DeepSpeed casts to bf16/fp16 and keeps fp32 masters
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        # "selective" needs no megatron recompute here: SDPA (flash on GPU) never stores the s x s scores.
        recompute_granularity=None,
        cuda_graph_scope=[],  # the whole layer, spelled the non-deprecated way (the default "full" warns per rank)
        mtp_num_layers=model_cfg.mtp_depths or None,  # sizes megatron-core's per-layer aux-loss trackers
    )
    if fused:
        from recipes.model.fast_path import fused_config_kwargs

        kwargs.update(fused_config_kwargs(model_cfg))
    return _config_with_variants(model_cfg, kwargs, ep)


def _config_with_variants(model_cfg, kwargs: dict, ep: int) -> TransformerConfig:
    """The config with model.mla's fields (megatron-core's MLATransformerConfig, recipes.model.mla) and model.moe's
    (recipes.model.moe)."""
    import warnings

    config_class = TransformerConfig
    if model_cfg.mla is not None:
        from megatron.core.transformer.transformer_config import MLATransformerConfig

        from recipes.model.mla import mla_config_kwargs, softmax_scale

        kwargs.update(mla_config_kwargs(model_cfg), softmax_scale=softmax_scale(model_cfg))
        config_class = MLATransformerConfig
    if model_cfg.moe is not None:
        from recipes.model.moe import moe_config_kwargs

        kwargs.update(moe_config_kwargs(model_cfg, ep))
    with warnings.catch_warnings():
        # "sequence parallelism must be used" with EP x TP: our MoE layer splits the sequence over TP itself
        warnings.filterwarnings("ignore", message=".*sequence parallelism must be used")
        return config_class(**kwargs)


# ------------------------------------------------------------------------------------------------- building blocks
class TorchNorm(nn.Module):
    """RMSNorm / LayerNorm with plain `weight` (+ `bias`) names; under sequence parallelism each TP rank sees a slice
    of the sequence, so the weight gradients are summed over the TP group (what megatron does in its grad finaliser).
    """

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-5):
        super().__init__()
        self.rms = config.normalization == "RMSNorm"
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))
        self.bias = None if self.rms else nn.Parameter(torch.zeros(hidden_size, dtype=config.params_dtype))
        if config.sequence_parallel:
            for p in self.parameters():
                p.sequence_parallel = True
                p.register_hook(_allreduce_over_tp)

    def forward(self, x):
        if self.rms:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


def _allreduce_over_tp(grad):
    grad = grad.clone()
    torch.distributed.all_reduce(grad, group=parallel_state.get_tensor_model_parallel_group())
    return grad


class SDPAttention(MegatronModule):
    """Causal core attention through torch `scaled_dot_product_attention` (flash / memory-efficient kernels on GPU).

    Takes megatron-core's shapes: query [s, b, heads, d], key/value [s, b, groups, d]; returns [s, b, heads * d].
    With `model.document_mask` the layer hands in document ids [b, s] as `attention_mask` (see `document_ids`):
    attention is then causal within each document of the packed sample (`document_attention`).
    """

    def __init__(self, config, layer_number, attn_mask_type, attention_type, attention_dropout=None,
                 softmax_scale=None, cp_comm_type=None, pg_collection=None, **_):
        super().__init__(config=config)
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        self.softmax_scale = softmax_scale

    def forward(self, query, key, value, attention_mask=None, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        dropout = self.dropout if self.training else 0.0
        if context.context_parallel_size() > 1:  # this rank's chunks attend to the gathered sequence
            from recipes.model.context_attention import context_parallel_attention

            return context_parallel_attention(query, key, value, attention_mask, self.softmax_scale, dropout)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # -> [b, heads, s, d]
        if attention_mask is None:
            out = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, dropout_p=dropout, scale=self.softmax_scale,
                enable_gqa=q.shape[1] != k.shape[1])
        else:
            out = document_attention(q, k, v, attention_mask, self.softmax_scale, dropout)
        s, b = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)


# ------------------------------------------------------------------------------------------- document masking
def document_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """Document index [b, s] of each token of packed samples, from position ids that restart at 0 after each EOD
    (megatron-core's GPTDataset with reset_position_ids): a new document starts wherever the position is 0."""
    return (position_ids == 0).cumsum(dim=-1)


def document_causal_mask(docs: torch.Tensor) -> torch.Tensor:
    """Boolean SDPA mask [b, 1, s, s] (True = attend): same document and not in the future. Materialises s x s."""
    s = docs.shape[-1]
    causal = torch.ones(s, s, dtype=torch.bool, device=docs.device).tril()
    return (docs[:, None, :, None] == docs[:, None, None, :]) & causal


def _per_micro_batch(t: torch.Tensor, name: str, make):
    """`make()` once per micro-batch: kept on the tensor `t`, which every layer of a pipeline stage is handed (the
    position ids), and dropped with it."""
    cached = getattr(t, name, None)
    if cached is None:
        cached = make()
        setattr(t, name, cached)
    return cached


def _flex_block_mask(docs: torch.Tensor):
    """flex_attention's BlockMask for block-diagonal causal attention over `docs` [b, s]: it stores which 128 x 128
    tiles are empty, full or partial (O(s^2 / 128^2)), never an s x s mask."""
    from torch.nn.attention.flex_attention import create_block_mask

    def same_document_causal(b, h, q_idx, kv_idx):
        return (docs[b, q_idx] == docs[b, kv_idx]) & (q_idx >= kv_idx)

    b, s = docs.shape
    return _per_micro_batch(docs, "_flex_block_mask", lambda: create_block_mask(
        same_document_causal, B=b, H=None, Q_LEN=s, KV_LEN=s, device=docs.device))


_compiled_flex = None


def flex_document_attention(q, k, v, docs, scale=None, compiled: bool = True):
    """Document-causal attention through torch flex_attention (q [b, heads, s, d], k/v [b, groups, s, d]).

    Compiled (the GPU path) it runs a fused kernel that skips empty tiles; eager (`compiled=False`, what the CPU tests
    check it with) it is torch's reference implementation.
    """
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    fn = flex_attention
    if compiled:
        if _compiled_flex is None:
            _compiled_flex = torch.compile(flex_attention, dynamic=False)
        fn = _compiled_flex
    return fn(q, k, v, block_mask=_flex_block_mask(docs), scale=scale, enable_gqa=q.shape[1] != k.shape[1])


def document_attention(q, k, v, docs, scale=None, dropout: float = 0.0):
    """Causal attention within each document of packed samples. CUDA: flex_attention (no s x s mask; no dropout,
    which the recipes keep at 0). CPU: SDPA with a boolean [b, 1, s, s] mask (built once per micro-batch and stage)."""
    if q.is_cuda and dropout == 0.0:
        return flex_document_attention(q, k, v, docs, scale)
    mask = _per_micro_batch(docs, "_sdpa_mask", lambda: document_causal_mask(docs))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout,
                                          scale=scale, enable_gqa=q.shape[1] != k.shape[1])


def rope_inv_freq(head_dim: int, base: float, scaling=None) -> torch.Tensor:
    """RoPE inverse frequencies [d/2] (fp32), optionally with Llama 3.1's "llama3" scaling (`model.rope_scaling`).

    Written op for op like transformers' `_compute_default_rope_parameters` / `_compute_llama3_parameters`, so an
    imported Llama 3.x checkpoint sees bit-identical angles.
    """
    import math

    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype=torch.float) / head_dim))
    if scaling is None:
        return inv_freq
    if scaling.type == "yarn":
        from recipes.model.mla import yarn_inv_freq

        return yarn_inv_freq(head_dim, base, scaling)
    factor, low, high = scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor
    old_context = scaling.original_max_position_embeddings
    low_freq_wavelen, high_freq_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    # long wavelengths (beyond the original context) are slowed by `factor`, short ones kept, the band between
    # interpolated smoothly
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rope_table(seq_length: int, head_dim: int, base: float, scaling=None) -> torch.Tensor:
    """Rotary angles [s, 1, 1, d] in the layout megatron-core's `apply_rotary_pos_emb` expects (halves rotated)."""
    inv_freq = rope_inv_freq(head_dim, base, scaling)
    freqs = torch.outer(torch.arange(seq_length, dtype=torch.float32), inv_freq)
    return torch.cat([freqs, freqs], dim=-1)[:, None, None, :]


class HeadNorm(TorchNorm):
    """The norm of each query / key head (model.qk_norm): one weight of head_dim shared by all heads, and the heads
    are split over TP ranks, so its gradient is summed over the TP group (megatron-core does this for q/k_layernorm
    in its grad finaliser)."""

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-5):
        super().__init__(config, hidden_size, eps)
        if config.tensor_model_parallel_size > 1 and not config.sequence_parallel:  # (TorchNorm hooks it under SP)
            for p in self.parameters():
                p.register_hook(_allreduce_over_tp)


def layer_spec(config: TransformerConfig):
    """megatron-core's local GPT layer spec with CPU/GPU-safe norms and SDPA core attention."""
    spec = get_gpt_layer_local_spec(normalization=config.normalization, qk_layernorm=config.qk_layernorm)
    spec.submodules.input_layernorm = TorchNorm
    spec.submodules.pre_mlp_layernorm = TorchNorm
    spec.submodules.self_attention.submodules.core_attention = SDPAttention
    spec.submodules.self_attention.params = {"attn_mask_type": AttnMaskType.causal}
    if getattr(config, "multi_latent_attention", False):
        from recipes.model.mla import LatentAttention

        params = spec.submodules.self_attention.params
        spec.submodules.self_attention = ModuleSpec(module=LatentAttention, params=params)
    if config.qk_layernorm:
        spec.submodules.self_attention.submodules.q_layernorm = HeadNorm
        spec.submodules.self_attention.submodules.k_layernorm = HeadNorm
    return spec


def _init_normal(std):
    return lambda w: nn.init.normal_(w, mean=0.0, std=std)


class _Seeded:
    """Draw a layer's initial weights from its own seed without disturbing the global RNG."""

    def __init__(self, seed: int):
        self.seed = seed
        self._fork = None

    def __enter__(self):
        self._fork = torch.random.fork_rng(devices=[])
        self._fork.__enter__()
        torch.manual_seed(self.seed)

    def __exit__(self, *exc):
        return self._fork.__exit__(*exc)


# ---------------------------------------------------------------------------------------------------- pipe layers
class EmbeddingPipe(nn.Module):
    """tokens [b, s] -> hidden [s, b, h] (sequence-sharded [s/t, b, h] under sequence parallelism).

    With `model.document_mask` the input is (tokens, position_ids [b, s]) and the output (hidden, position_ids): the
    position ids travel with the hidden state through every pipeline stage (DeepSpeed sends tuples; integer tensors
    get no gradient)."""

    def __init__(self, config: TransformerConfig, model_cfg, seed: int):
        super().__init__()
        self.sequence_parallel = config.sequence_parallel
        self.vocab_size = model_cfg.vocab_size
        padded = model_cfg.padded_vocab_size(config.tensor_model_parallel_size)
        with _Seeded(seed):
            self.word_embeddings = tensor_parallel.VocabParallelEmbedding(
                padded, config.hidden_size, init_method=_init_normal(config.init_method_std), config=config)
        self.position_embeddings = None
        if model_cfg.position_embedding == "learned":
            # Own seed: the padded vocabulary (hence the RNG draws above) depends on TP.
            with _Seeded(seed + 1):
                self.position_embeddings = nn.Embedding(model_cfg.seq_length, config.hidden_size)
                _init_normal(config.init_method_std)(self.position_embeddings.weight)
        self._zero_padded_rows()

    def _zero_padded_rows(self):
        w = self.word_embeddings
        start = w.vocab_start_index
        first_pad = max(0, self.vocab_size - start)
        if first_pad < w.weight.shape[0]:
            with torch.no_grad():
                w.weight[first_pad:].zero_()

    def forward(self, inputs):
        tokens, position_ids = inputs if isinstance(inputs, tuple) else (inputs, None)
        seq = tokens.shape[1]
        x = self.word_embeddings(context.local_part(tokens))  # [b, s, h] ([b, s/cp, h] under CP), all-reduced over TP
        if self.position_embeddings is not None:
            if position_ids is None:
                at = context.local_positions(seq, x.device)
                x = x + (self.position_embeddings.weight[:seq] if at is None
                         else self.position_embeddings.weight[at]).unsqueeze(0)
            else:
                x = x + self.position_embeddings(context.local_part(position_ids))
        x = x.transpose(0, 1).contiguous()
        if self.sequence_parallel:
            x = tensor_parallel.scatter_to_sequence_parallel_region(x)
        return x if position_ids is None else (x, position_ids)


class DecoderLayerPipe(TransformerLayer):
    """megatron-core's TransformerLayer with a one-tensor pipeline interface: hidden [s, b, h] -> [s, b, h].

    The RoPE angles (fp32) live here, so nothing but the hidden state crosses stage boundaries; with
    `model.document_mask`, (hidden, position_ids) -> (hidden, position_ids): RoPE at each token's position within its
    document, attention within its document.
    """

    def __init__(self, config: TransformerConfig, model_cfg, layer_index: int, seed: int):
        with _Seeded(seed):
            super().__init__(config=config, submodules=self._submodules(config), layer_number=layer_index)
        self.use_rope = model_cfg.position_embedding == "rope"
        # A plain attribute, not a buffer: DeepSpeed casts buffers to bf16/fp16, and angles up to seq_length radians
        # must stay fp32 (bf16 would be off by whole radians at long positions).
        self._rope = None
        if self.use_rope:
            self._rope = rope_table(model_cfg.seq_length, model_cfg.rope_head_dim, model_cfg.rotary_base,
                                    model_cfg.rope_scaling)

    def forward(self, inputs):
        hidden, position_ids = inputs if isinstance(inputs, tuple) else (inputs, None)
        rope = None
        if self.use_rope:
            if self._rope.device != hidden.device:
                self._rope = self._rope.to(hidden.device)
            if position_ids is None:
                sp = self.config.tensor_model_parallel_size if self.config.sequence_parallel else 1
                seq = hidden.shape[0] * sp  # attention sees the full sequence under SP (this rank's under CP)
                at = context.local_positions(seq * context.context_parallel_size(), hidden.device)
                rope = self._rope[:seq] if at is None else self._rope[at]
            else:  # per-token angles [s, b, 1, d] (position_ids is the full sequence, also under SP and CP)
                rope = self._rope[:, 0, 0, :][context.local_part(position_ids).t()].unsqueeze(2)
        docs = None if position_ids is None else _per_micro_batch(position_ids, "_document_ids",
                                                                  lambda: document_ids(position_ids))
        out, _ = super().forward(hidden, attention_mask=docs, rotary_pos_emb=rope)
        return out if position_ids is None else (out, position_ids)


    def _submodules(self, config):
        return layer_spec(config).submodules


class MoEDecoderLayerPipe(DecoderLayerPipe):
    """A decoder layer whose MLP is the mixture of experts of model.moe (recipes.model.moe.MoEMLP); attention, norms
    and the pipeline interface are DecoderLayerPipe's."""

    def __init__(self, config: TransformerConfig, model_cfg, layer_index: int, seed: int):
        from recipes.model.moe import MoEMLP

        super().__init__(config, model_cfg, layer_index, seed)
        self.mlp = MoEMLP(config, layer_index, seed)  # its own seeds: the attention above draws the same as dense

    def _submodules(self, config):
        from megatron.core.transformer.identity_op import IdentityOp

        submodules = layer_spec(config).submodules
        submodules.mlp = IdentityOp  # replaced by MoEMLP once the layer exists
        return submodules


class FinalNormPipe(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.norm = TorchNorm(config, config.hidden_size, config.layernorm_epsilon)

    def forward(self, hidden):
        if isinstance(hidden, tuple):  # (hidden, position_ids): nothing after the norm needs the positions
            hidden = hidden[0]
        return self.norm(hidden)


class OutputHeadPipe(nn.Module):
    """hidden [s, b, h] -> vocab-parallel logits [s, b, V/t] (untied head)."""

    def __init__(self, config: TransformerConfig, model_cfg, seed: int):
        super().__init__()
        padded = model_cfg.padded_vocab_size(config.tensor_model_parallel_size)
        with _Seeded(seed):
            self.output_layer = tensor_parallel.ColumnParallelLinear(
                config.hidden_size, padded, config=config, init_method=_init_normal(config.init_method_std),
                bias=False, gather_output=False, skip_bias_add=False)

    def forward(self, hidden):
        logits, _ = self.output_layer(hidden)
        return logits


def tied_head_forward(embedding: EmbeddingPipe, hidden):
    """Output head that reuses the input embedding (tied): gathers SP shards / marks the TP all-reduce for backward."""
    if embedding.sequence_parallel:
        hidden = tensor_parallel.gather_from_sequence_parallel_region(hidden)
    else:
        hidden = tensor_parallel.copy_to_tensor_model_parallel_region(hidden)
    return F.linear(hidden, embedding.word_embeddings.weight)


# ---------------------------------------------------------------------------------------------------------- loss
class VocabParallelLoss:
    """Mean token cross-entropy over unmasked tokens, on vocab-parallel logits, padded vocabulary masked out (under CP:
    over the whole sequence's real tokens, see recipes.model.context.mean_over_context)."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def __call__(self, logits, labels_and_mask):
        labels, loss_mask = labels_and_mask
        start = parallel_state.get_tensor_model_parallel_rank() * logits.shape[-1]
        logits = logits.float()
        n_real = self.vocab_size - start
        if n_real < logits.shape[-1]:
            pad = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
            pad[max(n_real, 0):] = True
            logits = logits.masked_fill(pad, torch.finfo(logits.dtype).min)
        labels, loss_mask = context.local_part(labels), context.local_part(loss_mask)  # CP: this rank's tokens
        losses = tensor_parallel.vocab_parallel_cross_entropy(logits, labels.transpose(0, 1).contiguous())
        mask = loss_mask.transpose(0, 1).float()
        return context.mean_over_context((losses * mask).sum(), mask.sum())


# ------------------------------------------------------------------------------------------------ layers / stacks
def layer_builders(model_cfg, config: TransformerConfig, seed: int) -> dict:
    """index -> a function that builds that layer (see the module docstring for the numbering); a tied model has no
    index L+2 (its head is layer 0's embedding); model.mtp's prediction depths are L+3 .. L+2+D (recipes.model.mtp)."""
    L = model_cfg.num_layers
    builders = {0: partial(EmbeddingPipe, config, model_cfg, seed)}
    builders.update({i: partial(MoEDecoderLayerPipe if model_cfg.is_moe_layer(i - 1) else DecoderLayerPipe, config,
                                model_cfg, i, seed + SEED_STRIDE * i) for i in range(1, L + 1)})
    builders[L + 1] = partial(FinalNormPipe, config)
    if not model_cfg.tied_embeddings:
        builders[L + 2] = partial(OutputHeadPipe, config, model_cfg, seed + SEED_STRIDE * (L + 2))
    if model_cfg.mtp is not None:
        from recipes.model.mtp import depth_class

        depths = range(L + 3, L + 3 + model_cfg.mtp_depths)
        builders.update({i: partial(depth_class(model_cfg), config, model_cfg, i, seed + SEED_STRIDE * i)
                         for i in depths})
    return builders


class TiedHeadCopy(EmbeddingPipe):
    """The last pipeline rank's copy of a tied word embedding, used as the output head. Built from the embedding's
    own seed (the same initial values) and without position embeddings; its gradient is summed with the first
    rank's before every optimizer step, so both copies take the same updates."""

    def __init__(self, config: TransformerConfig, model_cfg, seed: int):
        super().__init__(config, model_cfg, seed)
        self.position_embeddings = None
        self.word_embeddings.weight.ds_pipe_replicated = True  # ZeRO's grad norm counts the first rank's copy only

    def forward(self, hidden):
        return tied_head_forward(self, hidden)


class DecoderStack(nn.Module):
    """Layers `indices` of the model (recipes.parallel.partition's numbering) as children "0", "3", ...: the names
    of the parameters do not depend on the layout. `tied_copy`: this rank holds the last chunk of a pipeline whose
    embedding is also used there (tied head, model.mtp's depths): a `TiedHeadCopy` as child "0"."""

    def __init__(self, recipe, layout, indices: list[int], tied_copy: bool = False):
        super().__init__()
        from recipes.model.fast_path import fusions_enabled

        m = recipe.model
        config = transformer_config(m, layout.tp, layout.sequence_parallel, fusions_enabled(recipe), layout.ep)
        self.recompute_full = layout.recompute == "full"
        self.tied = m.tied_embeddings
        self.shares_embedding = m.tied_embeddings or m.mtp is not None  # the last chunk uses layer 0's embedding
        self.head_index = m.num_layers + 2
        self.loss_fn = VocabParallelLoss(m.vocab_size)
        if m.mtp is not None:
            from recipes.model.mtp import MTPLoss

            self.loss_fn = MTPLoss(self.loss_fn, m.mtp_depths, m.mtp.loss_weight)
        builders = layer_builders(m, config, recipe.training.seed)
        held = sorted(set(indices) | ({0} if tied_copy else set()))
        for i in held:
            if i == 0 and tied_copy:
                self.add_module("0", TiedHeadCopy(config, m, recipe.training.seed))
            elif i in builders:
                self.add_module(str(i), builders[i]())

    def run(self, indices: list[int], x, mtp_labels=None):
        """Layers `indices` in order on x: tokens (or (tokens, position_ids)) into layer 0, hidden states between,
        vocab-parallel logits out of the head; a chunk holding model.mtp's depths returns theirs after the head's
        (recipes.model.mtp), from the final norm's output and the labels."""
        depths = [i for i in indices if i > self.head_index]
        trunk = None
        for i in indices:
            if i > self.head_index:
                break
            positions = x[1] if depths and isinstance(x, tuple) else None  # (document masking)
            x = self._layer(i, x)
            if depths and i == self.head_index - 1:
                trunk = (x, positions)  # the main model's final (normed) hidden state: what the depths start from
        if depths:
            x = self._depths(depths, x, trunk, mtp_labels)
        if isinstance(x, tuple):  # (hidden, position_ids) leaving a chunk that ends before the final norm
            x = x[0]
        return x

    def _depths(self, depths: list[int], logits, trunk, labels):
        """model.mtp: each depth's logits after the main ones, [(1 + D) s, b, V/t]."""
        from recipes.model.mtp import depth_inputs

        hidden, position_ids = trunk
        embedding, out = getattr(self, "0"), [logits]
        for k, i in enumerate(depths, 1):
            layer = getattr(self, str(i))
            embedded = EmbeddingPipe.forward(embedding, depth_inputs(labels, k))  # the word embedding only (rope)
            args = (hidden, embedded, position_ids)
            if self.recompute_full and torch.is_grad_enabled():
                hidden = torch.utils.checkpoint.checkpoint(layer.depth, *args, use_reentrant=False)
            else:
                hidden = layer.depth(*args)
            out.append(self._layer(self.head_index, layer.final_layernorm(hidden)))
        return torch.cat(out, dim=0)

    def _layer(self, i: int, x):
        if self.tied and i == self.head_index:
            return tied_head_forward(getattr(self, "0"), x)
        layer = getattr(self, str(i))
        if self.recompute_full and isinstance(layer, DecoderLayerPipe) and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)
        return layer(x)


class StageChunk(nn.Module):
    """One virtual pipeline stage: layers `indices` of `stack`, run by torch.distributed.pipelining. The stack is
    kept outside this module's children, so the chunk adds no parameter names of its own (its `parameters()` are the
    stack's layers it runs). Input: tokens (first chunk) or the hidden state; with document masking the position ids
    come as a keyword on every stage (the schedule hands the same micro-batch's kwargs to each)."""

    def __init__(self, stack: DecoderStack, indices: list[int]):
        super().__init__()
        object.__setattr__(self, "_stack", stack)  # not a child: the stack owns the names
        self.indices = list(indices)
        for i in self.indices:  # parameters() of the chunk = its layers' (the schedule's weight gradients use them)
            if not (stack.tied and i == stack.head_index):
                self.add_module(f"layer_{i}", getattr(stack, str(i)))
        if stack.tied and stack.head_index in self.indices:
            self.add_module("tied_head", getattr(stack, "0"))
        if stack.shares_embedding and self.indices[-1] > stack.head_index and 0 not in self.indices:
            self.add_module("mtp_embedding", getattr(stack, "0"))  # model.mtp's depths embed tokens with it

    def forward(self, x, position_ids=None, mtp_labels=None):
        if position_ids is not None:
            x = (x, position_ids)
        return self._stack.run(self.indices, x, mtp_labels)


class PlainDecoder(DecoderStack):
    """All layers in one module (PP = 1, any ZeRO stage): tokens -> vocab-parallel logits -> loss.

    `inputs` is what the first layer takes: tokens [b, s], or (tokens, position_ids) with `model.document_mask`.
    Children are named "0", "1", ... by layer index."""

    def __init__(self, recipe, layout):
        m = recipe.model
        L = m.num_layers
        super().__init__(recipe, layout, list(range(L + 3 + m.mtp_depths)))
        self.order = list(range(L + 3 + m.mtp_depths))
        self.num_pipe_layers = L + 3 + m.mtp_depths

    def logits(self, inputs, mtp_labels=None):
        """Vocab-parallel logits [s, b, V/t]; with `mtp_labels` (model.mtp) each depth's after them."""
        order = self.order if mtp_labels is not None else [i for i in self.order if i <= self.head_index]
        return self.run(order, inputs, mtp_labels)

    def forward(self, inputs, labels, loss_mask):
        return self.loss_fn(self.logits(inputs, labels if self.order[-1] > self.head_index else None),
                            (labels, loss_mask))


def swiglu_fc1_full_order(shards: list[torch.Tensor]) -> torch.Tensor:
    """Full [2f, h] fc1 of a SwiGLU layer as [gate; up] from per-TP-rank shards (each [gate_r; up_r])."""
    gates, ups = zip(*(s.chunk(2, dim=0) for s in shards))
    return torch.cat(list(gates) + list(ups), dim=0)


def count_model_parameters(module: nn.Module) -> int:
    """Parameters held by this rank (tied weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())

