"""The model cut into DeepSpeed pipeline stages: a PipelineModule over megatron-core's rank order."""
from __future__ import annotations

from recipes.model.fast_path import fusions_enabled
from recipes.model.layers import VocabParallelLoss, layer_specs, transformer_config
from recipes.parallel.partition import deepspeed_method


def build_pipeline_module(recipe, layout):
    """DeepSpeed PipelineModule over a PipeModelDataParallelTopology matching megatron-core's rank order."""
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    m = recipe.model
    config = transformer_config(m, layout.tp, layout.sequence_parallel, fusions_enabled(recipe), layout.ep)
    # DeepSpeed's data axis is DP x CP (CP fastest inside it, as in megatron-core's tp-cp-dp-pp order)
    topo = PipeModelDataParallelTopology(num_pp=layout.pp, num_mp=layout.tp, num_dp=layout.data_axis)
    return PipelineModule(
        layers=layer_specs(m, config, recipe.training.seed),
        topology=topo,
        loss_fn=VocabParallelLoss(m.vocab_size),
        partition_method=deepspeed_method(recipe.parallel.pipeline_partition),
        activation_checkpoint_interval=1 if layout.recompute == "full" else 0,
        checkpointable_layers=["DecoderLayerPipe", "MoEDecoderLayerPipe"],
    )
