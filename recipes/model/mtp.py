"""Multi-token prediction (model.mtp; DeepSeek-V3 report Section 2.2): D extra prediction depths after the decoder.

Depth k (1..D) predicts token i + k + 1 at position i. Its input is depth k-1's hidden state of token i (depth 0: the
main model's final hidden state, after its final norm, which megatron-core's MTP, vLLM's and SGLang's DeepSeek MTP
and transformers' MtpModel all take) and the embedding of token i + k:
    h_k = Layer_k(eh_proj([enorm(embed(x_{i+k})); hnorm(h_{k-1})]))   logits_k = head(final_layernorm(h_k))
with the model's own word embedding and output head (shared, not copied), and a full decoder layer of the model's
kind (MLA, and the MoE MLP when the last decoder layer has it, as DeepSeek-V3's layer 61). Its loss is the cross
entropy against the labels k positions further on (the last k positions of a sample have no target and are masked);
training minimises main + loss_weight / D x sum_k loss_k (megatron-core's MTP does the same; its modules run only on
CUDA ranks, so these are ours, from the decoder layer's parts).

Where they live: pipeline indices L+3 .. L+2+D (after the head, L+2), in the last chunk with the final norm and the
head (recipes.parallel.partition keeps them together), so a stage boundary still carries one hidden tensor. That
chunk needs the embedding: a pipeline's last rank holds a copy of layer 0's word embedding (as for tied embeddings,
recipes.model.layers.TiedHeadCopy) whose gradient is summed with the first rank's. The token ids a depth embeds are
the labels shifted (x_{i+k} = labels_{i+k-1}), handed to every stage with the micro-batch (`mtp_labels`). The last
chunk returns the main logits and each depth's stacked along the sequence dimension, [(1 + D) s, b, V/t], and
`MTPLoss` splits them again.

What is reported: the training and validation `loss` stay the main (next-token) loss, so runs with and without MTP
compare; the depths' losses are logged as `mtp_loss` (one per depth). The objective's gradient includes them.

Parameters of depth k (index i = L+2+k), besides the decoder layer's own names (input_layernorm, self_attention.*,
pre_mlp_layernorm, mlp.*): enorm.weight [h], hnorm.weight [h], eh_proj.weight [h, 2h] (TP dim 0, output gathered as
megatron-core's), final_layernorm.weight [h] (transformers / DeepSeek: shared_head.norm).
"""
from __future__ import annotations

import torch

from data_prep.lazy_compile import import_with_compile_deferred

import_with_compile_deferred(("megatron.core",))  # its fusions compiled at their first call, not at this import
from megatron.core import parallel_state, tensor_parallel

from recipes.model.layers import DecoderLayerPipe, MoEDecoderLayerPipe, TorchNorm, _Seeded, _init_normal

MTP_SEED_OFFSET = 3_000_017  # a depth's own parts (norms, eh_proj) draw from its layer seed + this


class _Depth:
    """What a prediction depth adds to a decoder layer (mixed into DecoderLayerPipe / MoEDecoderLayerPipe)."""

    def _add_depth_parts(self, config, seed: int) -> None:
        h = config.hidden_size
        with _Seeded(seed + MTP_SEED_OFFSET):
            self.enorm = TorchNorm(config, h, config.layernorm_epsilon)
            self.hnorm = TorchNorm(config, h, config.layernorm_epsilon)
            self.eh_proj = tensor_parallel.ColumnParallelLinear(
                2 * h, h, config=config, init_method=_init_normal(config.init_method_std), bias=False,
                gather_output=False)
            self.final_layernorm = TorchNorm(config, h, config.layernorm_epsilon)

    def depth(self, hidden, embedded, position_ids=None):
        """h_{k-1} [s, b, h] (SP: [s/t, b, h]) and embed(x_{i+k}) alike -> h_k, before the final norm."""
        x, _ = self.eh_proj(torch.cat([self.enorm(embedded), self.hnorm(hidden)], dim=-1))
        x = tensor_parallel.gather_from_tensor_model_parallel_region(x)  # [s, b, h] on every TP rank
        if self.config.sequence_parallel:
            x = tensor_parallel.scatter_to_sequence_parallel_region(x)
        out = self(x if position_ids is None else (x, position_ids))
        return out[0] if isinstance(out, tuple) else out


class MTPLayerPipe(_Depth, DecoderLayerPipe):
    """A prediction depth whose decoder layer has a dense MLP."""

    def __init__(self, config, model_cfg, layer_index: int, seed: int):
        super().__init__(config, model_cfg, layer_index, seed)
        self._add_depth_parts(config, seed)


class MoEMTPLayerPipe(_Depth, MoEDecoderLayerPipe):
    """A prediction depth whose decoder layer has the MoE MLP (DeepSeek-V3's)."""

    def __init__(self, config, model_cfg, layer_index: int, seed: int):
        super().__init__(config, model_cfg, layer_index, seed)
        self._add_depth_parts(config, seed)
        # megatron-core's aux-loss trackers number the depths L+1 .. L+D (our pipeline indices are L+3 .. L+2+D)
        self.mlp.router.set_layer_number(layer_index - 2)


def depth_class(model_cfg):
    return MoEMTPLayerPipe if model_cfg.mtp_is_moe else MTPLayerPipe


def depth_inputs(labels: torch.Tensor, k: int) -> torch.Tensor:
    """Token ids depth k embeds at each position i: x_{i+k} = labels_{i+k-1} ([b, s]; 0 past the end)."""
    if k == 1:
        return labels
    out = torch.zeros_like(labels)
    out[:, :-(k - 1)] = labels[:, k - 1:]
    return out


def depth_targets(labels: torch.Tensor, mask: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Depth k's labels (x_{i+k+1} = labels_{i+k}) and loss mask (0 for the last k positions, which have none)."""
    out, out_mask = torch.zeros_like(labels), torch.zeros_like(mask)
    out[:, :-k] = labels[:, k:]
    out_mask[:, :-k] = mask[:, k:]
    return out, out_mask


class MTPLoss:
    """Loss of the last chunk's [(1 + D) s, b, V/t] logits: its value is the main loss, its gradient that of
    main + weight / D x sum_k loss_k. Each depth's loss of training micro-batches is summed for `take_losses`."""

    def __init__(self, main_loss, depths: int, weight: float):
        self.main_loss, self.depths, self.weight = main_loss, depths, weight
        self.sums, self.count = torch.zeros(depths, dtype=torch.float64), 0

    def __call__(self, logits, labels_and_mask):
        labels, mask = labels_and_mask
        s = logits.shape[0] // (1 + self.depths)
        # megatron-core's vocab-parallel cross entropy works in place on the logits it is given (and keeps them for
        # backward): one slice of `logits` may be, the others are copies (a float() of bf16 logits copies anyway)
        main = self.main_loss(logits[:s], (labels, mask))
        losses = [self.main_loss(logits[k * s:(k + 1) * s].clone(), depth_targets(labels, mask, k))
                  for k in range(1, self.depths + 1)]
        if torch.is_grad_enabled():  # training micro-batches only
            self.sums += torch.stack([loss.detach().double().cpu() for loss in losses])
            self.count += 1
        extra = sum(losses) * (self.weight / self.depths)
        return main + (extra - extra.detach())

    def take_losses(self) -> tuple[torch.Tensor, int]:
        sums, count = self.sums.clone(), self.count
        self.sums.zero_()
        self.count = 0
        return sums, count


def mtp_losses(module, model_cfg, device) -> dict:
    """Collective (every rank, same steps): `mtp_loss`, each depth's mean loss over the training micro-batches since
    the last call. Counted once per DP replica: by the last stage's TP rank 0 and CP rank 0 (the others compute the
    same values)."""
    sums, count = module.loss_fn.take_losses()
    counted = (parallel_state.get_tensor_model_parallel_rank() == 0
               and parallel_state.get_context_parallel_rank() == 0 and count > 0)
    table = torch.cat([sums, torch.tensor([float(count)], dtype=torch.float64)]) if counted else \
        torch.zeros(model_cfg.mtp_depths + 1, dtype=torch.float64)
    table = table.to(device)
    torch.distributed.all_reduce(table)
    table = table.cpu()
    n = max(float(table[-1]), 1.0)
    return {"mtp_loss": [float(v) / n for v in table[:-1]]}
