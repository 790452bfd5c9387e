"""Test support: our model in one process (TP = PP = DP = 1) from a canonical full state: for logits checks, greedy generation and
inspection without a launcher. megatron-core's layers need its process groups, so a one-rank gloo group is made.
"""
from __future__ import annotations


import torch

from recipes.checkpoint.format.shards import pad_vocab
from recipes.parallel.layout import Layout


def init_single_process() -> None:
    """A world of one (gloo) and megatron-core's groups at TP = PP = 1; no-op when already there."""
    from megatron.core import parallel_state

    if not torch.distributed.is_initialized():
        # An in-memory store: a world of one needs no port (and MASTER_ADDR/PORT in os.environ would leak into
        # later launches).
        torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)


def build_plain_model(recipe, weights: dict) -> torch.nn.Module:
    """`recipes.model.layers.PlainDecoder` at TP = 1 holding `weights` (canonical names), in eval mode."""
    from recipes.model.layers import PlainDecoder

    init_single_process()
    model = PlainDecoder(recipe, Layout(tp=1, pp=1, dp=1, zero_stage=0))
    padded = recipe.model.padded_vocab_size(1)
    own = {k for k in model.state_dict() if not k.endswith("_extra_state")}
    missing, extra = own - set(weights), set(weights) - own
    if missing or extra:
        raise ValueError(f"weights do not fit the recipe's model: missing {sorted(missing)[:5]}, "
                         f"unexpected {sorted(extra)[:5]}")
    full = {k: pad_vocab(k, v, padded) for k, v in weights.items()}
    model.load_state_dict(full, strict=False)
    return model.eval()


@torch.no_grad()
def logits(model, tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[b, s] tokens -> [b, s, vocab_size] logits (padding columns dropped)."""
    return model.logits(tokens).transpose(0, 1)[..., :vocab_size]


@torch.no_grad()
def greedy(model, prompt: torch.Tensor, new_tokens: int, vocab_size: int) -> torch.Tensor:
    """Greedy continuation of a [1, s] prompt by full re-forward (no KV cache: a reference, not a server)."""
    x = prompt
    for _ in range(new_tokens):
        nxt = logits(model, x, vocab_size)[:, -1].argmax(-1, keepdim=True)
        x = torch.cat([x, nxt], dim=1)
    return x
