"""The rank order is encoded once (recipes.parallel.layout.Layout.RANK_ORDER): the groups megatron-core builds from
`layout.megatron_order` are the ones `Layout.coords` implies, for every dimension and a grid of layouts (megatron-
core's own rank generator, the code initialize_model_parallel builds its groups with, run without processes); a
planted other order is caught by the same check recipes.train.groups.build runs on every rank."""
from __future__ import annotations

import itertools

import pytest
from megatron.core.parallel_state import RankGenerator

from recipes.parallel.layout import Layout
from recipes.train.groups import group_mismatches

pytestmark = pytest.mark.unit


def megatron_groups(layout: Layout, order: str) -> dict[int, dict[str, list[int]]]:
    """rank -> its groups as megatron-core 0.16's initialize_model_parallel builds them with `order`."""
    dense = RankGenerator(tp=layout.tp, ep=1, dp=layout.dp, pp=layout.pp, cp=layout.cp, order=order)
    token = {"tp": "tp", "cp": "cp", "dp": "dp", "pp": "pp", "dp_cp": "dp-cp"}
    found = {name: dense.get_ranks(t) for name, t in token.items()}
    if layout.ep > 1:  # expert TP = TP; the experts split the data axis dp x cp
        experts = RankGenerator(tp=layout.tp, ep=layout.ep, dp=layout.dp * layout.cp // layout.ep, pp=layout.pp, cp=1,
                                order=order)
        found["ep"], found["edp"] = experts.get_ranks("ep"), experts.get_ranks("dp")
    out: dict[int, dict[str, list[int]]] = {r: {} for r in range(layout.world_size)}
    for name, groups in found.items():
        for g in groups:
            for r in g:
                out[r][name] = list(g)
    return out


LAYOUTS = [Layout(tp=tp, cp=cp, dp=dp, pp=pp, ep=ep)
           for tp, cp, dp, pp, ep in itertools.product((1, 2), (1, 2), (1, 2, 4), (1, 2), (1, 2, 4))
           if (dp * cp) % ep == 0]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: lay.describe().split(",")[0] + f" EP={lay.ep}")
def test_megatron_cores_groups_follow_the_layouts_rank_order(layout):
    built = megatron_groups(layout, layout.megatron_order)
    bad = [m for r in range(layout.world_size) for m in group_mismatches(layout, r, built[r])]
    assert bad == []


def test_a_group_built_in_another_order_is_caught():
    layout = Layout(tp=2, cp=2, dp=2, pp=2, ep=2)
    assert layout.megatron_order == "tp-cp-ep-dp-pp"
    built = megatron_groups(layout, "tp-dp-ep-cp-pp")  # DP before CP: every DP and CP group crosses
    bad = group_mismatches(layout, 1, built[1])
    assert "rank 1's dp group is [1, 3], the layout's is [1, 5]" in bad
    assert "rank 1's cp group is [1, 5], the layout's is [1, 3]" in bad


def test_coords_and_rank_are_inverse_and_tp_is_fastest():
    layout = Layout(tp=2, cp=2, dp=3, pp=2)
    assert all(layout.rank(**layout.coords(r)) == r for r in range(layout.world_size))
    assert [layout.coords(r)["tp"] for r in range(4)] == [0, 1, 0, 1]
    assert layout.coords(4) == {"tp": 0, "cp": 0, "dp": 1, "pp": 0}
