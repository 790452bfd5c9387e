"""The cost model's modelling choices (`Assumptions`), printed with every plan so a reader can disagree with a number.

Two kinds live here. Efficiency terms (how close to the datasheet the kernels and links run, how much overlap hides)
are fitted: to published runs for the GPU presets (`recipes.planner.calibration`, files in configs/clusters/
calibration/) and to a cluster's own runs by `recipes plan --calibrate`. Stack settings (which overlaps a training
stack has, how DeepSpeed buckets gradients) describe what runs; the defaults are this project's trainer.
"""
from __future__ import annotations

from dataclasses import dataclass

from recipes.parallel.ds_config import zero_comm_settings

# What recipes.parallel.ds_config writes for a GPU run: the planner prices exactly that (overlap, buckets, ZeRO-3 prefetch).
_DS_GPU = zero_comm_settings(3, "cuda")

# The efficiency terms a calibration may fit (recipes.planner.calibration); everything else is a stack setting.
FITTED_TERMS = ("kernel_efficiency", "gemm_falloff", "elementwise_hidden", "attention_efficiency",
                "intra_link_efficiency", "inter_link_efficiency", "latency_intra_s", "latency_inter_s",
                "overlap_efficiency", "layer_overhead_s", "micro_batch_overhead_s", "step_overhead_s")


@dataclass(frozen=True)
class Assumptions:
    """Our modelling choices, printed with every plan so a reader can disagree with a number, not a black box."""
    # Compute efficiency = kernel_efficiency x d/(d+gemm_falloff) for the per-GPU hidden slice d = h/t and for the
    # tokens per micro-batch x h/(h+elementwise_hidden) (memory-bound norms, softmax and activations weigh more at
    # small h). The defaults are Megatron-LM's Table 1 fit (9 runs, A100); a GPU preset's calibration file replaces
    # them (docs/planner.md, "Calibration").
    kernel_efficiency: float = 0.7
    gemm_falloff: float = 64
    elementwise_hidden: float = 1024
    intra_link_efficiency: float = 0.4  # NCCL bus bandwidth / datasheet NVLink (bidirectional) figure
    inter_link_efficiency: float = 0.8  # NCCL bus bandwidth / InfiniBand line rate per node
    # ZeRO-2 reduce-scatters hide behind the backward only with DeepSpeed's overlap_comm=true (what
    # recipes/parallel/ds_config.py writes for GPU runs): then this share of the backward hides them.
    overlap_comm: bool = _DS_GPU["overlap_comm"]
    contiguous_gradients: bool = _DS_GPU["contiguous_gradients"]  # with overlap_comm: two reduce buckets
    overlap_efficiency: float = 0.8  # the share of the compute beside a collective that hides it, where one is hidden
    # Overlaps other stacks have and this project's trainer does not (published runs are priced with theirs):
    # Megatron-LM's --tp-comm-overlap (TP collectives behind the GEMMs), --overlap-grad-reduce (ZeRO-0/1's gradient
    # reduction behind the last backward) and its asynchronous pipeline sends.
    tp_comm_overlap: bool = False
    dp_comm_overlap: bool = False
    pp_comm_overlap: bool = False
    latency_intra_s: float = 2e-6  # NCCL latency per ring step over NVLink
    latency_inter_s: float = 5e-6  # NCCL latency per ring step over InfiniBand
    # Framework overhead outside the FLOPs: per layer and pass (kernel launches), per micro-batch (the engine's and
    # the data loader's Python, the loss), per step (optimizer, logging). Negligible for large models on GPUs (0 in
    # the GPU presets); on CPU ranks running a tiny model they are most of the step, and `plan --calibrate` fits them.
    layer_overhead_s: float = 0.0
    micro_batch_overhead_s: float = 0.0
    step_overhead_s: float = 0.0
    # SDPA/flash kernels on GPU: no s x s score matrix is stored, and causal attention skips the masked upper
    # triangle (half the attention FLOPs). False prices kernels that compute the scores and then mask them.
    flash_attention: bool = True
    # Share of peak the flash attention kernels reach, forward and backward: FlashAttention-2, which torch's SDPA flash
    # backend is built on, reaches 35% of an H100's (Shah et al. 2024, FlashAttention-3, abstract; FA3 reaches 75%,
    # and FA2 reaches more of an A100's). It matters at long context: at 128K attention is most of a small model's
    # FLOPs. Without flash kernels the scores are batched GEMMs at the GEMM efficiency.
    attention_efficiency: float = 0.35
    dropout: bool = False  # recipes.model.layers builds with hidden/attention dropout 0.0
    # Fixed memory per GPU: the CUDA context (lazy module loading) and cuBLAS/cuBLASLt workspaces, then NCCL's buffers
    # per communicator the rank uses (Simple 4 MiB + LL128 ~4.5 MiB + LL per channel and peer, up to 32 channels).
    cuda_context_gib: float = 0.6
    gib_per_communicator: float = 0.3
    bucket_elements: float = _DS_GPU["reduce_bucket_size"]  # DeepSpeed reduce/allgather bucket
    zero3_bucket_elements: float = _DS_GPU["stage3_prefetch_bucket_size"]  # ZeRO-3 prefetches this many elements ahead
    fragmentation: float = 0.05  # allocator fragmentation, as a share of everything else
    # The share of the device's memory (gpu_memory_gb, decimal GB) a recommended layout leaves free: the model above
    # is an estimate, and allocator peaks, NCCL's lazy buffers and other processes need room. Layouts that fit the
    # device but not this margin are listed as "tight" and recommended only when nothing else fits.
    memory_headroom: float = 0.10
    max_micro_batch: int = 16
    # Layers the pipeline partition takes off the first stage, which holds the most micro-batches in flight (and the
    # embedding): 0 for this project's uniform split; Llama 3 and GLM-130B took one off their first and last stages.
    lighter_first_stage: int = 0
    # Mixture of experts (recipes.planner.experts): the busiest EP rank receives this many times the mean routed
    # tokens. 1.0 unless measured: the published MoE throughput the planner is checked against is measured with the
    # token distribution force-balanced (Megatron-Bridge's performance summary: "we force-balance the token
    # distribution among experts"); `plan --from-run RUN_DIR` takes the run's own metrics.jsonl moe_load_imbalance,
    # and the plan says at what imbalance its EP choice would change.
    moe_load_imbalance: float = 1.0

    @classmethod
    def for_device(cls, device_type: str, **changes) -> "Assumptions":
        """The assumptions for runs on `device_type` ("cuda": the defaults; "cpu": what the CPU/gloo runs write),
        with DeepSpeed's settings read from `recipes.parallel.ds_config.zero_comm_settings` like the defaults."""
        ds = zero_comm_settings(3, device_type)
        return cls(**{"overlap_comm": ds["overlap_comm"], "contiguous_gradients": ds["contiguous_gradients"],
                      "bucket_elements": ds["reduce_bucket_size"],
                      "zero3_bucket_elements": ds["stage3_prefetch_bucket_size"], **changes})
