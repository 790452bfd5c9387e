"""Recipe schema: the typed shape of a training recipe (model, parallel, training, data, checkpoint, logging, cluster).

Loading (extends, overrides) lives in `recipes.config.loading`; cross-field rules in `recipes.planner.validation`. This module only
says what a recipe *is*; every field has a default where a sensible one exists so that small recipes stay small.
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt


class _Section(BaseModel):
    # Unknown keys are errors (typos must not be silently ignored); validate_assignment keeps overrides typed.
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(_Section):
    num_layers: PositiveInt
    hidden_size: PositiveInt
    num_attention_heads: PositiveInt
    num_query_groups: Optional[PositiveInt] = None  # None = multi-head attention (groups == heads)
    ffn_hidden_size: Optional[PositiveInt] = None  # None = 4h (gelu) or the Llama rule for swiglu
    vocab_size: PositiveInt
    seq_length: PositiveInt
    position_embedding: Literal["rope", "learned"] = "rope"
    rotary_base: PositiveFloat = 10000.0
    normalization: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    norm_epsilon: PositiveFloat = 1e-5
    activation: Literal["swiglu", "gelu"] = "swiglu"
    tied_embeddings: bool = False
    add_bias_linear: bool = False
    init_method_std: PositiveFloat = 0.02
    make_vocab_size_divisible_by: PositiveInt = 128
    # Packed samples: restart position ids after each EOD and attend only within the token's own document
    # (block-diagonal causal mask; flex_attention on CUDA, SDPA with a boolean mask on CPU). See docs/concepts.md.
    document_mask: bool = False

    @property
    def query_groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def ffn_size(self) -> int:
        if self.ffn_hidden_size:
            return self.ffn_hidden_size
        if self.activation == "swiglu":  # Llama: 2/3 * 4h rounded up to a multiple of 256
            f = int(2 * 4 * self.hidden_size / 3)
            return 256 * ((f + 255) // 256)
        return 4 * self.hidden_size

    def padded_vocab_size(self, tp: int) -> int:
        """Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by * tp."""
        m = self.make_vocab_size_divisible_by * tp
        return ((self.vocab_size + m - 1) // m) * m


class ParallelConfig(_Section):
    tp: PositiveInt = 1
    pp: PositiveInt = 1
    dp: Optional[PositiveInt] = None  # None = derived from the world size
    zero_stage: Literal[0, 1, 2, 3] = 1
    sequence_parallel: bool = False
    recompute: Literal["none", "selective", "full"] = "none"
    pipeline_partition: Literal["uniform", "parameters"] = "uniform"  # see recipes.parallel.partition
    micro_batch: PositiveInt = 1


class OptimizerConfig(_Section):
    type: Literal["adam", "adamw"] = "adamw"
    lr: PositiveFloat = 3e-4
    min_lr: float = Field(default=3e-5, ge=0)
    beta1: float = Field(default=0.9, ge=0, lt=1)
    beta2: float = Field(default=0.95, ge=0, lt=1)
    eps: PositiveFloat = 1e-8
    weight_decay: float = Field(default=0.1, ge=0)


class ScheduleConfig(_Section):
    warmup_steps: int = Field(default=0, ge=0)
    decay: Literal["cosine", "linear", "constant"] = "cosine"
    decay_steps: Optional[PositiveInt] = None  # None = the whole run


class TrainingConfig(_Section):
    global_batch: PositiveInt
    train_steps: Optional[PositiveInt] = None
    train_tokens: Optional[PositiveInt] = None  # alternative to train_steps
    optimizer: OptimizerConfig = OptimizerConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    grad_clip: float = Field(default=1.0, ge=0)
    precision: Literal["bf16", "fp16", "fp32"] = "bf16"
    loss_scale: Optional[float] = Field(default=None, ge=0)  # fp16: 0/None = dynamic
    initial_loss_scale_power: int = 16
    seed: int = 1234
    eval_interval: PositiveInt = 100
    eval_iters: PositiveInt = 10
    log_interval: PositiveInt = 1
    max_consecutive_nan_skips: PositiveInt = 5
    dist_timeout_minutes: PositiveInt = 30
    reference_global_batch: Optional[PositiveInt] = None  # the preset's batch the lr was tuned for (for warnings)
    reference_lr: Optional[PositiveFloat] = None  # the preset's lr at reference_global_batch (for warnings)
    # GPU fast path (recipes.model.fast_path): refuse torch's math SDPA kernel for bf16/fp16 unless allowed here; compile
    # each decoder layer with torch.compile (opt-in: compile time is minutes at 1B+ scale).
    allow_math_attention: bool = False
    compile_decoder_layers: bool = False

    def steps(self, seq_length: int) -> int:
        if self.train_steps:
            return self.train_steps
        if self.train_tokens:
            per_step = self.global_batch * seq_length
            return max(1, -(-self.train_tokens // per_step))
        raise ValueError("training: set train_steps or train_tokens")


class DataConfig(_Section):
    manifests: list[str] = []  # data_prep manifest.json files (or dirs holding one)
    blend: list[tuple[float, str]] = []  # explicit (weight, prefix) pairs; overrides manifests
    split: str = "98,2,0"  # train, valid, test per Megatron
    tokenizer: Optional[str] = None  # sentencepiece .model or HF tokenizer path (for export and inspection)
    cache_dir: Optional[str] = None  # dataset index cache; default <checkpoint.dir>/data_cache
    # DataLoader worker processes reading samples ahead of the step (0 = in the training process); same samples,
    # same order, either way (recipes.train.data.MicroBatches).
    num_workers: int = Field(default=0, ge=0)


class CheckpointConfig(_Section):
    dir: Optional[str] = None
    save_interval: Optional[PositiveInt] = None
    keep_last: PositiveInt = 2
    auto_resume: bool = True


class LoggingConfig(_Section):
    dir: Optional[str] = None  # TensorBoard + metrics.jsonl; default <checkpoint.dir>/logs
    tensorboard: bool = True
    wandb_project: Optional[str] = None


class ClusterConfig(_Section):
    name: str = "custom"
    nodes: PositiveInt = 1
    gpus_per_node: PositiveInt = 8
    gpu: str = "H100-80GB"
    gpu_memory_gb: PositiveFloat = 80.0
    peak_tflops: PositiveFloat = 989.0  # dense bf16
    intra_node_gbps: PositiveFloat = 900.0  # GB/s per GPU (NVLink)
    inter_node_gbps: PositiveFloat = 400.0  # GB/s per node (e.g. 8 x 400 Gb/s NDR = 400 GB/s)
    backend: Literal["nccl", "gloo"] = "nccl"
    device: Literal["cuda", "cpu"] = "cuda"

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


class Recipe(_Section):
    name: str = "recipe"
    model: ModelConfig
    parallel: ParallelConfig = ParallelConfig()
    training: TrainingConfig
    data: DataConfig = DataConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    logging: LoggingConfig = LoggingConfig()
    cluster: ClusterConfig = ClusterConfig()
