"""Published closed-form counts the cost model is checked against (tests/recipes/test_planner_formulas.py,
docs/planner.md): Narayanan et al. 2021 (Megatron-LM, SC21) Eq. 2 and Eq. 3, Korthikanti et al. 2022's model FLOPs."""
from __future__ import annotations


def megatron_eq2_params(layers: int, hidden: int, vocab: int, seq: int) -> float:
    """Narayanan et al. 2021, Eq. 2 (GPT with biases, LayerNorm, learned positions, tied output layer)."""
    l, h = layers, hidden
    return 12 * l * h * h * (1 + 13 / (12 * h) + (vocab + seq) / (12 * l * h))


def megatron_eq3_flops(global_batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Narayanan et al. 2021, Eq. 3: FLOPs per iteration including the recompute forward (full recomputation)."""
    B, s, l, h = global_batch, seq, layers, hidden
    return 96 * B * s * l * h * h * (1 + s / (6 * h) + vocab / (16 * l * h))


def korthikanti_model_flops(global_batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Korthikanti et al. 2022: model FLOPs per iteration without recompute (what MFU counts)."""
    B, s, L, h = global_batch, seq, layers, hidden
    return 72 * B * L * s * h * h * (1 + s / (6 * h) + vocab / (12 * h * L))

