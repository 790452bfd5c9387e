"""The mixture-of-experts MLP of a decoder layer (model.moe): megatron-core's router, our token dispatcher, experts
with stacked weights, megatron-core's shared expert.

Forward of one MoE layer, hidden [s, b, h] (each TP rank holds the whole sequence unless sequence parallelism is on):
  shared expert (megatron-core `SharedExpertMLP`, a TP-split MLP, optional sigmoid gate) on the layer input;
  with TP > 1 and no sequence parallelism each TP rank takes 1/tp of the sequence (the MoE part is sequence-parallel
  inside, as megatron-core requires: otherwise every TP rank would route the same tokens and the experts would count
  them tp times);
  router (megatron-core `TopKRouter`: top-k, load-balancing aux loss and z-loss attached to the autograd graph by
  `MoEAuxLossAutoScaler`, capacity and token dropping) -> dispatch over EP (and TP) ranks (`moe_dispatch`) ->
  experts -> combine -> the slices gathered back -> + shared expert.

Parameters (names inside the decoder layer; E experts, n = E / ep on this rank, f = expert ffn, fs = shared ffn):

  | name                                 | local shape                   | full (canonical) shape | split        |
  |--------------------------------------|-------------------------------|------------------------|--------------|
  | mlp.router.weight                    | [E, h]                        | [E, h]                 | -            |
  | mlp.experts.linear_fc1.weight        | [n, 2f/tp, h] swiglu (f gelu) | [E, 2f, h] ([gate; up])| EP 0, TP 1   |
  | mlp.experts.linear_fc2.weight        | [n, h, f/tp]                  | [E, h, f]              | EP 0, TP 2   |
  | mlp.shared_experts.linear_fc1.weight | [2fs/tp, h]                   | [2fs, h] ([gate; up])  | TP 0         |
  | mlp.shared_experts.linear_fc2.weight | [h, fs/tp]                    | [h, fs]                | TP 1         |
  | mlp.shared_experts.gate_weight       | [1, h]                        | [1, h]                 | -            |

Expert j of EP rank r is global expert r * n + j; a SwiGLU fc1 shard holds [gate_t; up_t] of its TP rank t, like the
dense fc1. Each global expert draws its initial weights from its own seed, full size, then takes its shard: the full
weights do not depend on TP or EP.

How DeepSpeed sees the experts (ep > 1): expert weights carry DeepSpeed's MoE attributes (`allreduce=False`,
`group_name="ep_size_<ep>"`), the optimizer puts them in DeepSpeed's MoE param groups, and a marker module the engine
adds makes DeepSpeed build ZeRO with megatron-core's expert groups (recipes.train.expert_parallel).
"""
from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

from data_prep.lazy_compile import import_with_compile_deferred

import_with_compile_deferred(("megatron.core",))  # its fusions compiled at their first call, not at this import
from megatron.core import parallel_state
from megatron.core.transformer.mlp import MLPSubmodules
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler, z_loss_func
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.moe.shared_experts import SharedExpertMLP

from recipes.model.deepseek_routing import add_bias_buffers, sigmoid_routing
from recipes.model.moe_dispatch import AllToAllDispatcher, gather_sequence, scatter_sequence

EXPERT_SEED_OFFSET = 1_000_003  # expert e of the layer seeded s draws from s + EXPERT_SEED_OFFSET + e
MOE_SEED_OFFSET = 2_000_003  # the router and the shared expert of that layer draw from s + MOE_SEED_OFFSET


def moe_config_kwargs(model_cfg, ep: int) -> dict:
    """megatron-core TransformerConfig fields of model.moe at expert-parallel degree `ep`."""
    moe = model_cfg.moe
    if moe is None:
        return {}
    return dict(
        num_moe_experts=moe.num_experts, moe_router_topk=moe.top_k, moe_ffn_hidden_size=model_cfg.expert_ffn_size,
        moe_shared_expert_intermediate_size=moe.shared_expert_ffn_size, moe_shared_expert_gate=moe.shared_expert_gate,
        moe_router_load_balancing_type=(("seq_aux_loss" if moe.aux_loss_per_sequence else "aux_loss")
                                        if moe.aux_loss_coeff > 0 else "none"),
        moe_aux_loss_coeff=moe.aux_loss_coeff, moe_z_loss_coeff=moe.z_loss_coeff or None,
        moe_expert_capacity_factor=moe.capacity_factor, moe_token_drop_policy=moe.drop_policy,
        moe_pad_expert_input_to_capacity=False, moe_router_pre_softmax=not moe.normalize_top_k,
        moe_router_score_function=moe.score_function, moe_router_dtype="fp32", moe_token_dispatcher_type="alltoall",
        moe_router_num_groups=moe.num_groups, moe_router_group_topk=moe.group_top_k,
        moe_router_topk_scaling_factor=moe.routed_scaling_factor if moe.routed_scaling_factor != 1.0 else None,
        moe_router_enable_expert_bias=moe.expert_bias, moe_router_bias_update_rate=moe.bias_update_rate,
        moe_grouped_gemm=False, moe_permute_fusion=False, moe_router_fusion=False, expert_model_parallel_size=ep)


# ------------------------------------------------------------------------------------------------ aux-loss scale
_aux_loss_scale = lambda: 1.0  # noqa: E731  (set by the engine: the main loss's backward scale)


def set_aux_loss_scale(fn) -> None:
    """`fn()` -> the factor DeepSpeed applies to the main loss before backward (loss scale / gradient accumulation
    steps). megatron-core's `MoEAuxLossAutoScaler` injects d(aux)/d(aux) = this factor, so the aux and z losses
    enter the gradients exactly like a term of the loss, on every pipeline stage."""
    global _aux_loss_scale
    _aux_loss_scale = fn


def _inside_backward() -> bool:
    """True while autograd runs a backward pass (a recompute of activation checkpointing happens there)."""
    return torch._C._current_graph_task_id() != -1


# ------------------------------------------------------------------------------------------------------ router
class Router(TopKRouter):
    """megatron-core's top-k router, CPU-safe (its `gating` moves CPU weights to CUDA and needs Transformer Engine),
    recording the aux and z losses it attaches (for the routing statistics; recomputations are not counted twice)."""

    def __init__(self, config, pg_collection):
        expert_bias, config.moe_router_enable_expert_bias = config.moe_router_enable_expert_bias, False
        try:  # megatron-core would allocate the expert bias on the current CUDA device: made here instead
            super().__init__(config=config, pg_collection=pg_collection)
        finally:
            config.moe_router_enable_expert_bias = expert_bias
        self.enable_expert_bias = expert_bias
        if expert_bias:
            add_bias_buffers(self, config.num_moe_experts)
        self.normalize_top_k = not config.moe_router_pre_softmax  # (model.moe.normalize_top_k)
        self.aux = None  # on the loss's device: aux-loss sum, its count, z-loss sum, its count

    def _add(self, at: int, value: torch.Tensor) -> None:
        if self.aux is None or self.aux.device != value.device:
            self.aux = torch.zeros(4, dtype=torch.float64, device=value.device)
        self.aux[at] += value.detach().double()
        self.aux[at + 1] += 1

    def gating(self, input):
        # megatron-core's router_gating_linear needs Transformer Engine (te_general_gemm) when it is not installed
        dtype = torch.float32 if self.config.moe_router_dtype == "fp32" else input.dtype
        bias = None if self.bias is None else self.bias.to(dtype)
        return F.linear(input.to(dtype), self.weight.to(dtype), bias)

    def routing(self, logits, padding_mask=None):
        if self.score_function == "sigmoid":  # DeepSeek-V3's choice (recipes.model.deepseek_routing)
            return sigmoid_routing(self, logits)
        return super().routing(logits, padding_mask)

    def _apply_expert_bias(self, routing_map, padding_mask=None):
        """The tokens each expert got, for aux-loss-free balancing: training forwards only, and once (a recomputed
        forward routes the same tokens again). megatron-core's own is torch.compile'd: minutes on a CPU rank."""
        if self.enable_expert_bias and torch.is_grad_enabled() and not _inside_backward():
            if self.local_tokens_per_expert.dtype != torch.float32:  # DeepSpeed casts buffers to bf16 / fp16
                self.local_tokens_per_expert.data = self.local_tokens_per_expert.data.float()
            with torch.no_grad():
                self.local_tokens_per_expert += routing_map.sum(dim=0)

    def attach_and_log_load_balancing_loss(self, activation, aux_loss_coeff, aux_loss, *args, **kwargs):
        self._add(0, aux_loss)  # this rank's share (with its coefficient); the TP shares add up
        return super().attach_and_log_load_balancing_loss(activation, aux_loss_coeff, aux_loss, *args, **kwargs)

    def apply_z_loss(self, logits, padding_mask=None):
        if self.config.moe_z_loss_coeff is not None and self.training and torch.is_grad_enabled():
            with torch.no_grad():
                share = z_loss_func(logits, self.config.moe_z_loss_coeff / self.tp_cp_group.size(), padding_mask)
            self._add(2, share)
        return super().apply_z_loss(logits, padding_mask)


# ----------------------------------------------------------------------------------------------------- experts
class _Weight(nn.Module):
    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight)


def _grouped_mm_fits(*tensors: torch.Tensor) -> bool:
    """torch's grouped GEMM wants rows of a multiple of 16 bytes."""
    return hasattr(F, "grouped_mm") and all(t.shape[-1] * t.element_size() % 16 == 0 and
                                            t.shape[-2] * t.element_size() % 16 == 0 for t in tensors)


class GroupedExperts(nn.Module):
    """The n local experts of one MoE layer with stacked weights: fc1 [n, out/tp, h], fc2 [n, h, f/tp].

    Tokens arrive grouped by expert (`tokens_per_expert`); each expert computes act(x W1^T) * p W2^T, where p is the
    token's router probability for that expert (megatron-core applies it before fc2, as here). On CUDA one grouped
    GEMM per matrix (`torch.nn.functional.grouped_mm`), elsewhere a loop over the experts; the output is this TP
    rank's partial sum (the dispatcher reduce-scatters it).
    """

    def __init__(self, config, num_local: int, first_expert: int, layer_seed: int, tp: int, tp_rank: int, ep: int):
        super().__init__()
        self.config = config
        h, f = config.hidden_size, config.moe_ffn_hidden_size
        self.gated = config.gated_linear_unit
        fc1, fc2 = [], []
        for j in range(num_local):
            with _seeded(layer_seed + EXPERT_SEED_OFFSET + first_expert + j):
                full1 = torch.empty(2 * f if self.gated else f, h, dtype=config.params_dtype)
                config.init_method(full1)
                full2 = torch.empty(h, f, dtype=config.params_dtype)
                config.output_layer_init_method(full2)
            fc1.append(_tp_rows(full1, tp, tp_rank, self.gated))
            fc2.append(full2.chunk(tp, dim=1)[tp_rank])
        self.use_grouped_mm = None  # None: on CUDA when the shapes fit; True / False force it (tests)
        self.linear_fc1 = _Weight(torch.stack(fc1))
        self.linear_fc2 = _Weight(torch.stack(fc2))
        for p, dim in ((self.linear_fc1.weight, 1), (self.linear_fc2.weight, 2)):
            p.tensor_model_parallel, p.partition_dim, p.partition_stride = True, dim, 1
            if ep > 1:  # DeepSpeed's MoE parameter: reduced over the expert-data-parallel group only
                p.allreduce, p.group_name = False, f"ep_size_{ep}"

    def _act(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            gate, up = x.chunk(2, dim=-1)
            return self.config.activation_func(gate) * up
        return self.config.activation_func(x)

    def forward(self, tokens: torch.Tensor, tokens_per_expert: list[int], probs: torch.Tensor) -> torch.Tensor:
        w1, w2 = self.linear_fc1.weight, self.linear_fc2.weight
        scale = probs.unsqueeze(-1)
        grouped = self.use_grouped_mm
        if grouped is None:  # torch's grouped GEMM kernels: bf16 on Hopper and newer
            grouped = (tokens.is_cuda and tokens.dtype == torch.bfloat16 and _grouped_mm_fits(w1, w2)
                       and torch.cuda.get_device_capability(tokens.device) >= (9, 0))
        if grouped:
            offs = torch.tensor(tokens_per_expert, device=tokens.device).cumsum(0).to(torch.int32)
            hidden = self._act(F.grouped_mm(tokens, w1.transpose(1, 2), offs=offs))
            hidden = (hidden * scale).to(tokens.dtype)
            return F.grouped_mm(hidden, w2.transpose(1, 2), offs=offs)
        # unbind, not w[j]: indexing a stacked weight per expert makes autograd zero-fill a full-size gradient for
        # every expert (E^2 memory traffic); unbind's backward stacks the E gradients once
        outs = [part @ w.t() for part, w in zip(tokens.split(tokens_per_expert), w1.unbind(0))]
        hidden = (self._act(torch.cat(outs)) * scale).to(tokens.dtype)
        return torch.cat([part @ w.t() for part, w in zip(hidden.split(tokens_per_expert), w2.unbind(0))])


def _tp_rows(full: torch.Tensor, tp: int, rank: int, gated: bool) -> torch.Tensor:
    """This TP rank's rows of a full fc1 [out, h]; SwiGLU: [gate_rank; up_rank] (megatron-core's per-shard order)."""
    if not gated:
        return full.chunk(tp, dim=0)[rank]
    gate, up = full.chunk(2, dim=0)
    return torch.cat([gate.chunk(tp, dim=0)[rank], up.chunk(tp, dim=0)[rank]])


def _seeded(seed: int):
    from recipes.model.layers import _Seeded  # layers builds this module: imported late to avoid a cycle

    return _Seeded(seed)


# --------------------------------------------------------------------------------------------------- MoE layer
class MoEMLP(MegatronModule):
    """A decoder layer's MoE MLP: (hidden [s, b, h]) -> (output [s, b, h], None), as megatron-core's MLP returns."""

    def __init__(self, config, layer_number: int, layer_seed: int):
        super().__init__(config=config)
        from megatron.core.transformer.moe.moe_utils import get_default_pg_collection
        from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

        pg = get_default_pg_collection()
        self.layer_number = layer_number
        self.tp_group = pg.tp
        self.tp, self.ep = pg.tp.size(), pg.ep.size()
        self.dispatcher = AllToAllDispatcher(config.num_moe_experts, pg.ep, pg.expt_tp, pg.tp_ep)
        local = self.dispatcher.local_experts
        with _seeded(layer_seed + MOE_SEED_OFFSET):
            self.router = Router(config, pg)
            self.shared_experts = None
            if config.moe_shared_expert_intermediate_size:
                self.shared_experts = SharedExpertMLP(
                    config, MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear),
                    gate=config.moe_shared_expert_gate, pg_collection=pg)
        self.router.set_layer_number(layer_number)
        self.experts = GroupedExperts(config, len(local), local.start, layer_seed, self.tp, pg.expt_tp.rank(),
                                      self.ep)
        self._replicated_grads_over_tp()
        self.stats = torch.zeros(config.num_moe_experts + 2, dtype=torch.float64)  # tokens per expert, dropped, calls

    def _replicated_grads_over_tp(self) -> None:
        """The router (and under sequence parallelism the shared-expert gate) is replicated over TP but each TP rank
        sees a slice of the tokens: its gradient is summed over the TP group (megatron-core marks these
        `sequence_parallel` and sums them in its grad finaliser, which DeepSpeed does not run)."""
        if self.tp == 1:
            return
        params = [self.router.weight]
        gate = getattr(self.shared_experts, "gate_weight", None)
        if self.config.sequence_parallel and gate is not None:
            params.append(gate)
        for p in params:
            p.register_hook(_allreduce_over_tp)

    def forward(self, hidden: torch.Tensor, padding_mask=None, **_):
        shared = self.shared_experts(hidden) if self.shared_experts is not None else None
        local_sp = self.tp > 1 and not self.config.sequence_parallel
        x = scatter_sequence(hidden, self.tp_group) if local_sp else hidden
        if self.training:
            MoEAuxLossAutoScaler.set_loss_scale(torch.tensor(float(_aux_loss_scale()), device=x.device))
        probs, routing_map = self.router(x)
        self._count(routing_map)
        tokens, per_expert, token_probs = self.dispatcher.dispatch(x.reshape(-1, x.shape[-1]), probs, routing_map)
        out = self.dispatcher.combine(self.experts(tokens, per_expert, token_probs)).view(x.shape)
        if local_sp:
            out = gather_sequence(out, self.tp_group)
        if shared is not None:
            out = out + shared
        return out, None

    @torch.no_grad()
    def _count(self, routing_map: torch.Tensor) -> None:
        """Tokens per expert and dropped assignments of a training forward (not of its recomputation)."""
        if not self.training or _inside_backward():
            return
        kept = routing_map.sum(dim=0).double().cpu()
        self.stats[:-2] += kept
        self.stats[-2] += routing_map.shape[0] * self.config.moe_router_topk - float(kept.sum())
        self.stats[-1] += 1

    def take_stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens per expert, dropped, forwards) and (aux sum, aux count, z sum, z count) since the last call."""
        stats = self.stats.clone()
        aux = self.router.aux.cpu() if self.router.aux is not None else torch.zeros(4, dtype=torch.float64)
        self.stats.zero_()
        self.router.aux = None
        return stats, aux


def _allreduce_over_tp(grad):
    grad = grad.clone()
    torch.distributed.all_reduce(grad, group=parallel_state.get_tensor_model_parallel_group())
    return grad


# ------------------------------------------------------------------------------------------ routing statistics
def moe_layers(module: nn.Module) -> list[MoEMLP]:
    return [m for m in module.modules() if isinstance(m, MoEMLP)]


def routing_stats(module: nn.Module, model_cfg, micro_batches: int, dp: int, device) -> dict:
    """Collective (every rank, same steps): routing statistics since the last call, for metrics.jsonl.

    Per step (the global batch), summed over the MoE layers unless per layer: `moe_tokens_per_expert` (one list per
    MoE layer, model.mtp's depths last), `moe_dropped_tokens` (token-expert assignments over capacity, 0 when
    dropless), `moe_dropped_frac`, `moe_load_imbalance` (busiest expert / mean, worst layer), `moe_aux_loss` and
    `moe_z_loss` (without their coefficients, mean over MoE layers and micro-batches, as megatron-core logs them); with
    model.moe.expert_bias `moe_expert_bias` (one list per MoE layer, after this step's update). TP ranks route disjoint slices and DP ranks
    disjoint samples (their counts add up); each layer lives on one pipeline stage.
    """
    E, L = model_cfg.moe.num_experts, model_cfg.num_layers + 2 + model_cfg.mtp_depths  # rows: layer number - 1
    table = torch.zeros(L, 2 * E + 4, dtype=torch.float64)  # counts, dropped, aux, z, ranks holding it, bias
    coeff, z_coeff = model_cfg.moe.aux_loss_coeff, model_cfg.moe.z_loss_coeff
    for layer in moe_layers(module):
        stats, aux = layer.take_stats()
        row = table[layer.layer_number - 1]
        calls = max(float(stats[-1]), 1.0)
        row[:E + 1] = stats[:-1] / calls * micro_batches  # this rank's share of one step
        row[E + 1] = aux[0] / max(float(aux[1]), 1.0) / dp / (coeff or 1.0)  # TP shares add, DP ranks average
        row[E + 2] = aux[2] / max(float(aux[3]), 1.0) / dp / (z_coeff or 1.0)
        row[E + 3] = 1.0
        if layer.router.expert_bias is not None:
            row[E + 4:] = layer.router.expert_bias.double().cpu()
    table = table.to(device)
    torch.distributed.all_reduce(table)
    table = table.cpu()
    rows = [table[i - 1] for i in model_cfg.moe_layer_numbers()]  # decoder layers, then model.mtp's depths
    per_layer = [r[:E] for r in rows]
    routed = sum(float(r[:E + 1].sum()) for r in rows)
    dropped = sum(float(r[E]) for r in rows)
    out = {"moe_tokens_per_expert": [[round(float(v)) for v in t] for t in per_layer],
           "moe_dropped_tokens": round(dropped), "moe_dropped_frac": dropped / routed if routed else 0.0,
           "moe_load_imbalance": max(float(t.max() / t.mean()) if t.sum() > 0 else 1.0 for t in per_layer)}
    if coeff > 0:
        out["moe_aux_loss"] = sum(float(r[E + 1]) for r in rows) / len(rows)
    if z_coeff > 0:
        out["moe_z_loss"] = sum(float(r[E + 2]) for r in rows) / len(rows)
    if model_cfg.moe.expert_bias:  # the same on every rank holding the layer: their sum over their number
        out["moe_expert_bias"] = [[round(float(v), 7) for v in r[E + 4:] / r[E + 3]] for r in rows]
    return out
