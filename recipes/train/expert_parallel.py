"""Expert parallelism between megatron-core and DeepSpeed: one set of expert groups, DeepSpeed's MoE machinery on
our experts, the aux-loss scale and the routing statistics of a training run.

- Groups: megatron-core makes the expert-parallel (EP) and expert-data-parallel (EDP) groups and
  recipes.train.groups registers them in DeepSpeed's group registry under DeepSpeed's name for them ("ep_size_<ep>"),
  so ZeRO partitions and reduces the experts over exactly the ranks megatron-core dispatches tokens over. DeepSpeed's own
  rule for these groups (`deepspeed.utils.groups._get_expert_parallel_ranks`) gives the same ranks (tested).
- ZeRO: expert weights carry `allreduce=False` and `group_name`; `build_param_groups` puts them in DeepSpeed's MoE
  param groups; `mark_for_deepspeed` gives every MoE layer a marker module that makes the engine build ZeRO with
  `has_moe_layers`: MoE groups are partitioned over the EDP group, their gradients averaged over all of DP (sum over
  EDP / dp).
- Checkpoints: after the engine is built it is told to save and load the files of a dense model (DeepSpeed's MoE
  checkpoint layout expects its own MoE module names, and its pipeline engine's MoE load path reads the wrong dict). Every DP rank's ZeRO file holds its fp32 masters, experts included; the
  module weights written by DP rank 0 hold only its experts, so after a load the module weights are rebuilt from
  the masters (`deepspeed_private.module_weights_from_masters`): a resumed run continues bit for bit.
"""
from __future__ import annotations

import torch

from recipes.checkpoint.format import deepspeed_private
from recipes.train.groups import expert_group_name


def mark_for_deepspeed(model: torch.nn.Module, num_experts: int, ep: int) -> None:
    """At ep > 1, before `deepspeed.initialize`: each MoE layer gets DeepSpeed's marker (a parameter-free child module,
    recipes.checkpoint.format.deepspeed_private.moe_marker), so the engine builds ZeRO for expert parameters."""
    from recipes.model.moe import moe_layers

    if ep == 1:
        return
    for layer in moe_layers(model):
        layer.deepspeed_marker = deepspeed_private.moe_marker(num_experts, ep, expert_group_name(ep))


def build_param_groups(groups: list[dict]) -> list[dict]:
    """Our decay / no-decay groups, expert weights moved into DeepSpeed's MoE groups (`moe: True`, `name` = their
    group name) when the model has expert-parallel parameters; unchanged otherwise."""
    from deepspeed.moe.utils import is_moe_param, split_params_into_different_moe_groups_for_optimizer

    if not any(is_moe_param(p) for g in groups for p in g["params"]):
        return groups
    named = [{**g, "name": name} for g, name in zip(groups, ("decay", "no_decay"))]
    return [g for g in split_params_into_different_moe_groups_for_optimizer(named) if g["params"]]


def after_initialize(engine, layout) -> None:
    """Once `deepspeed.initialize` built ZeRO with the expert groups: dense-model checkpoint files, module weights
    rebuilt from the masters after every load, and the aux-loss gradient scaled like the main loss."""
    from recipes.model.moe import set_aux_loss_scale

    # x cp: the CP ranks' aux and z-loss shares add up to the micro-batch's loss, and DeepSpeed averages gradients
    # over DP x CP (the main loss is scaled the same way: recipes.model.context.mean_over_context)
    set_aux_loss_scale(lambda: _main_loss_scale(engine) / engine.gradient_accumulation_steps() * layout.cp)
    if layout.ep == 1:
        return
    deepspeed_private.save_as_dense_model(engine)
    # DP rank 0's module file holds only its own experts: the module weights come from the masters after every load
    deepspeed_private.run_after_each_load(engine, deepspeed_private.module_weights_from_masters)


def _main_loss_scale(engine) -> float:
    opt = engine.optimizer
    for name in ("cur_scale", "loss_scale"):
        v = getattr(opt, name, None)
        if isinstance(v, (int, float, torch.Tensor)):
            return float(v)
    return 1.0


def update_expert_biases(eng, recipe) -> None:
    """After each optimizer step, aux-loss-free balancing (model.moe.expert_bias, recipes.model.deepseek_routing):
    this pipeline stage's router biases moved by the step's load, counted over the stage's TP x CP x DP ranks (every
    rank that routed tokens of its layers). A collective: every rank, every step."""
    moe = recipe.model.moe
    if moe is None or not moe.expert_bias:
        return
    from megatron.core import parallel_state as ps

    from recipes.model.deepseek_routing import update_expert_biases as update
    from recipes.model.moe import moe_layers

    group = ps.get_tensor_and_data_parallel_group(with_context_parallel=True)
    update([layer.router for layer in moe_layers(eng.module)], group, moe.bias_update_rate)
