"""Recipe schema: the typed shape of a training recipe (model, parallel, training, data, checkpoint, logging, cluster).

Loading (extends, overrides) lives in `recipes.config.loading`; cross-field rules in `recipes.planner.validation`. This module only
says what a recipe *is*; every field has a default where a sensible one exists so that small recipes stay small.
"""
from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, field_validator, model_validator

from data_prep.file_modes import parse as parse_mode


class _Section(BaseModel):
    # Unknown keys are errors (typos must not be silently ignored); validate_assignment keeps overrides typed.
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RopeScalingConfig(_Section):
    """RoPE frequency scaling of a long-context checkpoint, as transformers computes it. "llama3" (Llama 3.1,
    `_compute_llama3_parameters`): wavelengths above original_max_position_embeddings / low_freq_factor are divided
    by `factor`, those below original / high_freq_factor kept, the band between interpolated. "yarn" (DeepSeek-V3,
    `_compute_yarn_parameters`, model.mla only): frequencies interpolated by `factor` outside the band of
    beta_fast..beta_slow rotations, cos/sin times mscale(factor, mscale) / mscale(factor, mscale_all_dim) and the
    softmax scale times mscale(factor, mscale_all_dim)^2."""
    type: Literal["llama3", "yarn"] = "llama3"
    factor: float = Field(ge=1.0)  # Llama 3.1: 8, Llama 3.2: 32, DeepSeek-V3: 40
    low_freq_factor: PositiveFloat = 1.0
    high_freq_factor: PositiveFloat = 4.0
    original_max_position_embeddings: PositiveInt = 8192
    beta_fast: PositiveFloat = 32.0  # yarn
    beta_slow: PositiveFloat = 1.0  # yarn
    mscale: float = Field(default=0.0, ge=0)  # yarn (0 = unset; DeepSeek-V3: 1.0)
    mscale_all_dim: float = Field(default=0.0, ge=0)  # yarn (0 = unset; DeepSeek-V3: 1.0)

    @model_validator(mode="after")
    def _band(self):
        if self.type == "llama3" and self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(f"model.rope_scaling.high_freq_factor={self.high_freq_factor} must be greater than "
                             f"low_freq_factor={self.low_freq_factor} (Llama 3.1 uses 4.0 and 1.0)")
        return self


class MLAConfig(_Section):
    """Multi-head latent attention (DeepSeek-V2/V3; recipes.model.mla, docs/moe.md): queries through a low-rank
    projection, keys and values through one shared latent of kv_lora_rank per token, and a decoupled RoPE part per
    head whose key is shared by all heads. Names as transformers' DeepseekV3Config (megatron-core's in comments)."""
    q_lora_rank: Optional[PositiveInt] = None  # None = one full query projection (DeepSeek-V2-Lite); V3: 1536
    kv_lora_rank: PositiveInt  # the latent keys and values come from (V3: 512)
    qk_nope_head_dim: PositiveInt  # per head, the query/key part without RoPE (megatron qk_head_dim; V3: 128)
    qk_rope_head_dim: PositiveInt  # per head, the RoPE part (megatron qk_pos_emb_head_dim; V3: 64)
    v_head_dim: PositiveInt  # per head, the value width (V3: 128)

    @field_validator("qk_rope_head_dim")
    @classmethod
    def _even(cls, value):
        if value % 2:
            raise ValueError(f"model.mla.qk_rope_head_dim={value}: RoPE rotates pairs of dimensions; use an even size")
        return value


class MTPConfig(_Section):
    """Multi-token prediction (DeepSeek-V3; recipes.model.mtp, docs/moe.md): num_layers extra depths after the last
    decoder layer, depth k predicting the token k + 1 ahead through its own decoder layer, sharing the embedding and
    the output head. Trained with loss_weight / num_layers x the sum of the depths' losses; transformers runs them as
    draft layers (generate(use_mtp=True)) or ignores them."""
    num_layers: PositiveInt = 1  # prediction depths D (HF num_nextn_predict_layers; V3: 1)
    loss_weight: float = Field(default=0.1, gt=0)  # lambda (V3: 0.3 for the first 10T tokens, then 0.1)


class MoEConfig(_Section):
    """Mixture of experts in the MLP of some or all decoder layers (megatron-core's router, expert and shared-expert
    modules; docs/moe.md). Every field names the megatron-core / Hugging Face option it matches."""
    num_experts: PositiveInt  # routed experts per MoE layer (HF num_local_experts / num_experts)
    top_k: PositiveInt = 2  # experts per token (HF num_experts_per_tok)
    ffn_hidden_size: Optional[PositiveInt] = None  # per expert (HF moe_intermediate_size); None = model.ffn_size
    shared_expert_ffn_size: Optional[PositiveInt] = None  # an always-on shared expert MLP of this size; None = none
    shared_expert_gate: bool = False  # Qwen2-MoE: the shared expert's output times sigmoid(a learned h -> 1 gate)
    # True (Mixtral, Qwen3-MoE, DeepSeek-V3): the top-k probabilities are renormalized to sum to 1 (softmax over the
    # top-k logits); False (Qwen2-MoE): softmax over all experts, then top-k, not renormalized
    normalize_top_k: bool = True
    aux_loss_coeff: float = Field(default=1e-2, ge=0)  # load-balancing loss (Switch), per micro-batch; 0 = off
    z_loss_coeff: float = Field(default=0.0, ge=0)  # router z-loss (ST-MoE); 0 = off
    # None = dropless (every token reaches its top-k experts); else each expert takes at most
    # ceil(capacity_factor x tokens x top_k / num_experts) tokens of a micro-batch (per rank) and drops the rest
    capacity_factor: Optional[PositiveFloat] = None
    drop_policy: Literal["probs", "position"] = "probs"  # over capacity keep the most probable tokens / the first
    # Which decoder layers are MoE (the others keep a dense MLP of model.ffn_hidden_size): an int N = every N-th layer
    # from the first (megatron-core moe_layer_freq), or one 0/1 per layer; first_dense_layers (DeepSeek's
    # first_k_dense_replace) then keeps the first layers dense
    layer_pattern: Union[PositiveInt, list[Literal[0, 1]]] = 1
    first_dense_layers: int = Field(default=0, ge=0)
    # DeepSeek-V3 routing (recipes.model.deepseek_routing, docs/moe.md). "sigmoid": each expert scored on its own
    # (sigmoid of its logit), the chosen experts' scores renormalized when normalize_top_k; "softmax": Mixtral's
    score_function: Literal["softmax", "sigmoid"] = "softmax"
    # group-limited routing (HF n_group / topk_group): the experts in num_groups equal groups, a token's top_k chosen
    # only from its group_top_k best groups (a group scored by the sum of its 2 best scores); None = no groups
    num_groups: Optional[PositiveInt] = None
    group_top_k: Optional[PositiveInt] = None
    routed_scaling_factor: PositiveFloat = 1.0  # the routed experts' weights times this (V3: 2.5)
    # auxiliary-loss-free balancing (sigmoid routing): a per-expert bias added to the scores only to choose the
    # experts, after every step moved by bias_update_rate up for experts below the mean load of the global batch and
    # down for those above it (V3: 0.001); kept in the checkpoint (HF e_score_correction_bias)
    expert_bias: bool = False
    bias_update_rate: float = Field(default=1e-3, ge=0)
    # the load-balancing loss per sequence, averaged over the micro-batch's sequences (V3's complementary
    # sequence-wise loss, megatron-core seq_aux_loss), instead of over the micro-batch's tokens
    aux_loss_per_sequence: bool = False

    def is_moe_layer(self, index: int) -> bool:
        """Whether decoder layer `index` (0-based) has the MoE MLP."""
        if index < self.first_dense_layers:
            return False
        if isinstance(self.layer_pattern, int):
            return index % self.layer_pattern == 0
        return bool(self.layer_pattern[index]) if index < len(self.layer_pattern) else False


class ModelConfig(_Section):
    num_layers: PositiveInt
    hidden_size: PositiveInt
    num_attention_heads: PositiveInt
    num_query_groups: Optional[PositiveInt] = None  # None = multi-head attention (groups == heads)
    ffn_hidden_size: Optional[PositiveInt] = None  # None = 4h (gelu) or the Llama rule for swiglu
    vocab_size: PositiveInt
    seq_length: PositiveInt
    position_embedding: Literal["rope", "learned"] = "rope"
    rotary_base: PositiveFloat = 10000.0  # RoPE theta (Llama 3: 500000, Qwen2: 1000000)
    rope_scaling: Optional[RopeScalingConfig] = None  # None = plain RoPE
    normalization: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    norm_epsilon: PositiveFloat = 1e-5
    activation: Literal["swiglu", "gelu"] = "swiglu"
    tied_embeddings: bool = False
    add_bias_linear: bool = False  # biases on every linear layer (qkv, proj, fc1, fc2)
    add_qkv_bias: bool = False  # a bias on the qkv projection only (Qwen2); implied by add_bias_linear
    init_method_std: PositiveFloat = 0.02
    make_vocab_size_divisible_by: PositiveInt = 128
    # Packed samples: restart position ids after each EOD and attend only within the token's own document
    # (block-diagonal causal mask; flex_attention on CUDA, SDPA with a boolean mask on CPU). See docs/concepts.md.
    document_mask: bool = False
    # Attention heads of head_dim (None = hidden_size / num_attention_heads; Qwen3 uses 128 with any hidden size)
    head_dim: Optional[PositiveInt] = None
    qk_norm: bool = False  # RMSNorm / LayerNorm of each query and key head before RoPE (Qwen3; megatron qk_layernorm)
    moe: Optional[MoEConfig] = None  # None = every decoder layer has a dense MLP
    mla: Optional[MLAConfig] = None  # None = grouped-query attention (num_query_groups, head_dim)
    mtp: Optional[MTPConfig] = None  # None = next-token prediction only

    @model_validator(mode="after")
    def _rope_options(self):
        if self.rope_scaling is not None and self.position_embedding != "rope":
            raise ValueError(f"model.rope_scaling is set but model.position_embedding={self.position_embedding}; "
                             "remove rope_scaling or use position_embedding: rope")
        if self.rope_scaling is not None and self.rope_scaling.type == "yarn" and self.mla is None:
            raise ValueError("model.rope_scaling.type=yarn is supported with model.mla (DeepSeek-V3's RoPE) only; "
                             "use type llama3, or no rope_scaling")
        return self

    @model_validator(mode="after")
    def _mtp_options(self):
        if self.mtp is not None and self.position_embedding != "rope":
            raise ValueError(f"model.mtp with model.position_embedding={self.position_embedding}: the prediction "
                             "depths embed tokens with the word embedding only (DeepSeek-V3's); use rope or remove "
                             "model.mtp")
        return self

    @model_validator(mode="after")
    def _mla_options(self):
        problems = mla_problems(self) if self.mla is not None else []
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _moe_options(self):
        problems = moe_problems(self) if self.moe is not None else []
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def qkv_bias(self) -> bool:
        """Whether the qkv projection has a bias (add_bias_linear or add_qkv_bias)."""
        return self.add_bias_linear or self.add_qkv_bias

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

    @property
    def kv_channels(self) -> int:
        """Width of one attention head."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def rope_head_dim(self) -> int:
        """Width of the part of a head that RoPE rotates (the whole head, or MLA's decoupled part)."""
        return self.mla.qk_rope_head_dim if self.mla is not None else self.kv_channels

    @property
    def expert_ffn_size(self) -> int:
        """FFN size of one routed expert (model.moe.ffn_hidden_size, default the dense ffn size)."""
        return (self.moe.ffn_hidden_size if self.moe is not None else None) or self.ffn_size

    def is_moe_layer(self, index: int) -> bool:
        """Whether decoder layer `index` (0-based) has the MoE MLP (model.moe.layer_pattern)."""
        return self.moe is not None and self.moe.is_moe_layer(index)

    @property
    def mtp_depths(self) -> int:
        return self.mtp.num_layers if self.mtp is not None else 0

    @property
    def mtp_is_moe(self) -> bool:
        """A prediction depth's layer has the MoE MLP when the last decoder layer has (DeepSeek-V3's)."""
        return self.mtp is not None and self.is_moe_layer(self.num_layers - 1)

    def moe_layer_numbers(self) -> list[int]:
        """Pipeline indices (recipes.model.layers) of the layers with the MoE MLP: decoder layers 1..L, then the
        prediction depths L+3 .. L+2+D."""
        L = self.num_layers
        numbers = [i + 1 for i in range(L) if self.is_moe_layer(i)]
        return numbers + ([L + 2 + k for k in range(1, self.mtp_depths + 1)] if self.mtp_is_moe else [])

    def padded_vocab_size(self, tp: int) -> int:
        """Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by * tp."""
        m = self.make_vocab_size_divisible_by * tp
        return ((self.vocab_size + m - 1) // m) * m


def mla_problems(m: "ModelConfig") -> list[str]:
    """What model.mla cannot be combined with, each with the fix."""
    out = []
    if m.position_embedding != "rope":
        out.append(f"model.mla with model.position_embedding={m.position_embedding}: MLA's decoupled keys carry RoPE; "
                   "set position_embedding: rope")
    if m.num_query_groups not in (None, m.num_attention_heads):
        out.append(f"model.mla with model.num_query_groups={m.num_query_groups}: every MLA head has its own key and "
                   "value (from the shared latent); remove num_query_groups")
    for field in ("head_dim", "qk_norm", "add_qkv_bias", "add_bias_linear"):
        if getattr(m, field):
            out.append(f"model.mla with model.{field}={getattr(m, field)}: MLA's head widths are model.mla's "
                       f"(qk_nope/qk_rope/v_head_dim) and it has no biases or per-head norms; remove model.{field}")
    return out


def moe_problems(m: "ModelConfig") -> list[str]:
    """Every impossible model.moe combination, each with the fix (layout-dependent rules are in Layout.problems)."""
    moe, out = m.moe, []
    if moe.top_k > moe.num_experts:
        out.append(f"model.moe.top_k={moe.top_k} is larger than model.moe.num_experts={moe.num_experts}; set top_k <= "
                   f"{moe.num_experts}")
    if moe.top_k == 1 and moe.normalize_top_k:
        out.append("model.moe.top_k=1 with normalize_top_k=true: one renormalized probability is always 1 and the "
                   "router gets no gradient; set model.moe.normalize_top_k=false (softmax over all experts, Switch "
                   "style) or top_k >= 2")
    out += _routing_problems(moe)
    if moe.shared_expert_gate and moe.shared_expert_ffn_size is None:
        out.append("model.moe.shared_expert_gate=true without model.moe.shared_expert_ffn_size: there is no shared "
                   "expert to gate; set shared_expert_ffn_size (Qwen2-MoE: 4x the expert size) or remove the gate")
    if m.add_bias_linear:
        out.append("model.add_bias_linear=true with model.moe: experts here have no biases (megatron-core supports "
                   "expert biases only without expert tensor parallelism); set model.add_bias_linear=false "
                   "(model.add_qkv_bias=true is fine)")
    L = m.num_layers
    if isinstance(moe.layer_pattern, list) and len(moe.layer_pattern) != L:
        out.append(f"model.moe.layer_pattern has {len(moe.layer_pattern)} entries but model.num_layers={L}; give one "
                   "0/1 per decoder layer, or an int N for every N-th layer")
    elif isinstance(moe.layer_pattern, int) and moe.layer_pattern > L:
        out.append(f"model.moe.layer_pattern={moe.layer_pattern} (every N-th layer) is larger than model.num_layers="
                   f"{L}; use 1 (every layer) or a smaller N")
    elif not any(moe.is_moe_layer(i) for i in range(L)):
        out.append(f"model.moe.layer_pattern={moe.layer_pattern} with first_dense_layers={moe.first_dense_layers} "
                   f"leaves no MoE layer among the {L} layers; lower first_dense_layers or remove model.moe")
    return out


def _routing_problems(moe: MoEConfig) -> list[str]:
    """DeepSeek-V3 routing options that do not fit together, each with the fix."""
    out = []
    if (moe.num_groups is None) != (moe.group_top_k is None):
        out.append("model.moe.num_groups and model.moe.group_top_k come together (DeepSeek-V3: 8 and 4); set both or "
                   "neither")
    elif moe.num_groups is not None:
        size = moe.num_experts // moe.num_groups
        if moe.num_experts % moe.num_groups or size < 2:
            out.append(f"model.moe.num_groups={moe.num_groups} must split model.moe.num_experts={moe.num_experts} "
                       "into equal groups of 2 or more experts (a group is scored by its 2 best)")
        elif moe.group_top_k > moe.num_groups or moe.top_k > moe.group_top_k * size:
            out.append(f"model.moe.group_top_k={moe.group_top_k} groups of {size} experts cannot hold top_k="
                       f"{moe.top_k} experts (or exceeds num_groups={moe.num_groups}); raise group_top_k")
    if moe.expert_bias and moe.score_function != "sigmoid":
        out.append("model.moe.expert_bias=true needs model.moe.score_function=sigmoid (the bias shifts sigmoid scores, "
                   "as DeepSeek-V3's aux-loss-free balancing does)")
    return out


class ParallelConfig(_Section):
    tp: PositiveInt = 1
    pp: PositiveInt = 1
    dp: Optional[PositiveInt] = None  # None = derived from the world size
    zero_stage: Literal[0, 1, 2, 3] = 1
    sequence_parallel: bool = False
    cp: PositiveInt = 1  # context parallelism: each sequence split over cp ranks (recipes.model.context)
    recompute: Literal["none", "selective", "full"] = "none"
    pipeline_partition: Literal["uniform", "parameters"] = "uniform"  # see recipes.parallel.partition
    # virtual pipeline stages: each pipeline rank holds vpp model chunks (interleaved schedules,
    # recipes.parallel.pipeline)
    vpp: PositiveInt = 1
    # the pipeline schedule (PP > 1): "auto" = 1f1b at vpp = 1, interleaved_1f1b at vpp > 1; zero_bubble splits each
    # backward into its input and weight halves and fills the bubble with the weight halves
    pipeline_schedule: Literal["auto", "1f1b", "interleaved_1f1b", "zero_bubble"] = "auto"
    # expert parallelism (model.moe): the experts of each MoE layer split over ep ranks inside the data-parallel
    # dimension (ep divides dp); dense parameters stay replicated over all of dp
    ep: PositiveInt = 1
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


class StageLR(_Section):
    """A stage's own lr segment (e.g. the anneal of warmup-stable-decay): from start_lr at the stage's first step
    down to end_lr at its end, replacing training.schedule inside the stage (see recipes.config.stages)."""

    decay: Literal["linear", "cosine", "constant"] = "linear"
    start_lr: Optional[PositiveFloat] = None  # None = the lr at the boundary (previous segment's end_lr or the run's)
    end_lr: float = Field(default=0.0, ge=0)


class DataStage(_Section):
    """One data stage: its length (steps or tokens; one stage of the run may leave both out and take the rest), its
    blend (data.manifests / data.blend style; none = the run's data.manifests / data.blend), an optional lr segment."""

    name: Optional[str] = None  # default: stage<i>
    steps: Optional[PositiveInt] = None
    tokens: Optional[PositiveInt] = None  # rounded up to whole steps of global_batch x seq_length
    manifests: list[str] = []
    blend: list[tuple[float, str]] = []
    lr: Optional[StageLR] = None

    @model_validator(mode="after")
    def _one_length(self):
        if self.steps is not None and self.tokens is not None:
            raise ValueError(f"stage {self.name or ''} sets both steps={self.steps} and tokens={self.tokens}; keep one "
                             "(or neither, for the one stage that takes the rest of the run)")
        return self


class DataConfig(_Section):
    manifests: list[str] = []  # data_prep manifest.json files (or dirs holding one)
    blend: list[tuple[float, str]] = []  # explicit (weight, prefix) pairs; overrides manifests
    # Data stages in run order (recipes.config.stages); empty = one blend for the whole run. Validation always reads
    # data.manifests/blend when set, else the first stage's blend, so the validation curve spans the stages.
    stages: list[DataStage] = []
    split: str = "98,2,0"  # train, valid, test per Megatron
    tokenizer: Optional[str] = None  # sentencepiece .model or HF tokenizer path (for export and inspection)
    cache_dir: Optional[str] = None  # dataset index cache; default <checkpoint.dir>/data_cache
    # DataLoader worker processes reading samples ahead of the step (0 = in the training process); same samples,
    # same order, either way (recipes.train.data.MicroBatches).
    num_workers: int = Field(default=0, ge=0)
    # The shards checked against their manifest's sha256 before training reads them (data_prep.write.verify):
    # "index" every .idx and the .bin size it implies (~1% of the bytes, read anyway); "full" the .bin's sha256 too
    # (a read of every shard at start; docs/data_prep.md "Integrity" has the costs)
    verify: Literal["index", "full"] = "index"


class InitFrom(_Section):
    """Start this run from another run's checkpoint (a long-context stage, continued pretraining): its weights, and
    with `optimizer` its Adam moments, put into this run's engine at this run's layout (any TP/CP/PP/DP, ZeRO-0/1/2).
    The step, the consumed samples and the lr schedule start at zero (the schedule is this recipe's). Used only while
    checkpoint.dir holds no checkpoint: a restart resumes this run's own checkpoints (recipes.checkpoint.init_from).
    `init_from: DIR` is short for `init_from: {dir: DIR}`."""

    dir: str  # the source run's checkpoint.dir
    tag: Optional[str] = None  # global_stepN; None = the source's `latest`
    # Weights only by default: the new stage's schedule warms up from zero with fresh moments, as Llama 3's
    # long-context stages and most continued pretraining do; true carries Adam's moments and step count too
    # (ZeRO-1/2/3 sources).
    optimizer: bool = False


class CheckpointConfig(_Section):
    dir: Optional[str] = None
    init_from: Optional[InitFrom] = None  # start from another run's checkpoint (see InitFrom)
    save_interval: Optional[PositiveInt] = None
    # A run predicted to take more than an hour is refused before start without checkpoint.dir (a failure would
    # lose all of it); false says "I know, run without checkpoints".
    require_dir: bool = True
    keep_last: PositiveInt = 2
    auto_resume: bool = True
    # launch/stop.sh and launch/train.sh wait this long after SIGTERM (the ranks save a checkpoint and exit) before
    # they SIGKILL what is left: longer than a save of this model takes, or a pre-emption save is cut short
    stop_grace_seconds: PositiveInt = 60
    # true: a save copies the state into host shared memory and training goes on while the rank's writer process
    # writes it (complete.json once every rank's files are fsynced); false: training waits for the disk. Default true:
    # measured, an async save blocks training ~2% as long as a sync one (docs/cluster.md, "Asynchronous checkpoint
    # saves"); false saves the arena's host memory (one copy of the rank's checkpoint files, held for the run).
    async_save: bool = True
    # async only: cap each rank's background write rate (MiB/s), so that checkpoint writes on a shared file system
    # leave bandwidth to the data loaders of other jobs; None = as fast as the disk goes
    async_max_mib_per_s: Optional[PositiveFloat] = None
    # The mode of every file the run writes (checkpoints, also DeepSpeed's own files, the async writer's, metrics,
    # TensorBoard and the launcher's logs; reshape and export-hf output), e.g. "0640" or "0600" on a shared file
    # system; directories get x where r ("0750", "0700"). None = today's modes (0644 files, per the umask). Quote it.
    file_mode: Optional[str] = None

    @field_validator("file_mode", mode="before")
    @classmethod
    def _octal_mode(cls, v):
        if v is None:
            return None
        if isinstance(v, int) and not isinstance(v, bool):  # YAML reads an unquoted 0640 as the octal number
            if not 0 <= v <= 0o777:
                raise ValueError(f"{v} is not a file mode; quote it: \"0640\"")
            v = f"0{v:o}"
        return f"0{parse_mode(v):o}"

    @field_validator("init_from", mode="before")
    @classmethod
    def _init_from_shorthand(cls, value):
        return {"dir": value} if isinstance(value, str) else value


class EvaluationConfig(_Section):
    """Downstream evaluation during training: every `interval` steps the loop saves a checkpoint and global rank 0
    runs `python -m recipes evaluate` on it in a background subprocess (lm-evaluation-harness, HF backend); the
    scores land in metrics.jsonl and TensorBoard as eval/<task>/<metric>."""

    interval: Optional[PositiveInt] = None  # None = off
    tasks: list[str] = ["recipes_mc", "recipes_ppl"]  # shipped in recipes/tools/eval_tasks, or lm-eval task names
    include_path: Optional[str] = None  # a directory of your own task YAMLs
    text: Optional[str] = None  # perplexity (recipes_ppl) over this .jsonl / .txt instead of the shipped sample
    limit: Optional[PositiveInt] = None  # at most N documents per task
    device: str = "cpu"  # where the evaluation runs: "cpu", or a GPU the training does not use ("cuda:7")
    batch_size: PositiveInt = 8
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # bfloat16 halves the memory of a GPU evaluation


# W&B refuses these in project and entity names; a tag is at most 64 characters.
_WANDB_NAME_FORBIDDEN = set("/\\#?%:")


class WandbConfig(_Section):
    """Weights & Biases (pip install .[wandb]): global rank 0 logs the same records as metrics.jsonl into one W&B run
    per training run, resumed across restarts and requeues (recipes.train.tracking)."""

    project: str
    entity: Optional[str] = None  # team or user; None = the API key's default entity
    group: Optional[str] = None  # e.g. a sweep or an ablation family
    tags: list[str] = []
    name: Optional[str] = None  # the run's display name; None = the recipe's name
    # None = W&B's own choice (WANDB_MODE, else online); "offline" writes files to sync later (`wandb sync DIR`)
    mode: Optional[Literal["online", "offline", "disabled"]] = None
    # the W&B run to log into; None = this training run's own (kept in its log dir and checkpoints,
    # recipes.train.tracking)
    run_id: Optional[str] = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,64}$")

    @model_validator(mode="after")
    def _names_wandb_accepts(self):
        for key in ("project", "entity"):
            value = getattr(self, key)
            if value is not None and (not value.strip() or _WANDB_NAME_FORBIDDEN & set(value)):
                raise ValueError(f"logging.wandb.{key} = {value!r}: W&B names must be non-empty and may not contain "
                                 "any of / \\ # ? % :; pick another name")
        for tag in self.tags:
            if not tag.strip() or len(tag) > 64:
                raise ValueError(f"logging.wandb.tags: {tag!r} is not a W&B tag (1 to 64 characters); shorten or "
                                 "drop it")
        return self


class LoggingConfig(_Section):
    dir: Optional[str] = None  # TensorBoard + metrics.jsonl; default <checkpoint.dir>/logs
    tensorboard: bool = True
    wandb: Optional[WandbConfig] = None  # None = no W&B
    # Shorthand of older recipes for `wandb: {project: ...}`
    wandb_project: Optional[str] = None

    @model_validator(mode="after")
    def _one_wandb_project(self):
        if self.wandb_project is not None:
            if self.wandb is not None and self.wandb.project != self.wandb_project:
                raise ValueError("logging.wandb_project and logging.wandb.project disagree; keep logging.wandb.project "
                                 "and remove logging.wandb_project")
            if self.wandb is None:
                object.__setattr__(self, "wandb", WandbConfig(project=self.wandb_project))
        return self


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
    # For the save interval `recipes plan --write-recipe` sets (Young/Daly, recipes.planner.save_interval): how often
    # a node fails (failures per node per day; the presets say where their figure comes from) and how fast each node
    # writes a checkpoint to its storage (GB/s). None = Llama 3's figures, and the plan says so.
    node_failures_per_day: Optional[PositiveFloat] = None
    checkpoint_write_gbps_per_node: Optional[PositiveFloat] = None

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


class SupervisionConfig(_Section):
    """What launch/train.sh does when a run fails or hangs (docs/cluster.md, "Running a long job unattended")."""

    # Whole-job restarts from the newest complete checkpoint after a failure; launch/train.sh --max-restarts overrides
    max_restarts: int = Field(default=0, ge=0)
    # Wait before restart k: restart_backoff_seconds * 2**(k-1), at most restart_backoff_max_seconds (a flapping
    # node or file system gets time to come back; a restart storm does not hammer the scheduler or storage)
    restart_backoff_seconds: float = Field(default=10.0, ge=0)
    restart_backoff_max_seconds: float = Field(default=300.0, ge=0)
    # No rank changing step or phase for this long = a hang: stacks dumped, job stopped (and restarted). Larger than
    # the slowest save, evaluation and start-up phase. None = no hang watchdog.
    hang_timeout_seconds: Optional[PositiveFloat] = None
    # The slowest rank is named in the log when its compute time per step (outside the collectives) is this many
    # percent above the median of its pipeline stage for 3 log intervals in a row (recipes/train/stragglers.py)
    straggler_pct: PositiveFloat = 20.0


class Recipe(_Section):
    name: str = "recipe"
    model: ModelConfig
    parallel: ParallelConfig = ParallelConfig()
    training: TrainingConfig
    data: DataConfig = DataConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    logging: LoggingConfig = LoggingConfig()
    cluster: ClusterConfig = ClusterConfig()
    evaluation: EvaluationConfig = EvaluationConfig()
    supervision: SupervisionConfig = SupervisionConfig()

    @model_validator(mode="after")
    def _stages_fit_the_run(self):
        if self.data.stages:
            from recipes.config.stages import stage_plan

            stage_plan(self)  # raises ValueError naming the field and the fix
        return self
