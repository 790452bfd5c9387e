"""The run report's routing section is written from the MoE metrics (and only for MoE runs)."""

import pytest

from recipes.tools.report import moe_lines

pytestmark = pytest.mark.unit


def test_routing_section_from_the_metrics(tmp_path):
    base = {"loss": 5.0, "moe_dropped_frac": 0.0, "moe_z_loss": 2.0}
    train = [{**base, "step": 1, "moe_tokens_per_expert": [[3, 1], [2, 2]], "moe_dropped_tokens": 4,
              "moe_dropped_frac": 0.25, "moe_load_imbalance": 1.5, "moe_aux_loss": 1.2},
             {**base, "step": 2, "moe_tokens_per_expert": [[2, 2], [1, 3]], "moe_dropped_tokens": 0,
              "moe_load_imbalance": 1.5, "moe_aux_loss": 1.0}]
    text = "\n".join(moe_lines(train))
    assert "1.50 at step 1 -> 1.50 at step 2" in text and "dropped token-expert assignments: 4 (25.0%" in text
    assert "load-balancing loss (without its coefficient): 1.2000 -> 1.0000" in text and "z-loss" in text
    assert "tokens per expert at step 2, per MoE layer: 2 2; 1 3" in text
    assert moe_lines([{"step": 1, "loss": 5.0}]) == []
