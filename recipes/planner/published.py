"""Published training runs the cost model is calibrated and checked against, each with its source.

Every figure here is one a source states (its citation is on the run); a layout or setting the source does not state
is marked `unpublished` and priced at the planner's best choice for the published degrees (as the team, who tuned the
run, would have chosen), or, where it is inferred, the note says from what. Runs with role "fit" calibrate a GPU
family's efficiency terms (configs/clusters/calibration/<family>.yaml, written by docs/make_planner_doc.py --refit);
runs with role "held_out" were not fitted to and check the fit. The table in docs/planner.md and the test that pins it
(tests/recipes/test_planner_calibration.py) are made from this list.

A published throughput is compared in the unit it was published in, with the publisher's FLOP count:
- "hardware_tflops": FLOPs executed per second and GPU, recompute included, attention over the whole s x s block
  (Narayanan et al. 2021, Eq. 3); "hfu" the same over the peak.
- "model_tflops_full": model FLOPs (no recompute) with the whole attention block (Megatron-LM's count before 2025,
  Korthikanti et al.'s 72 B L s h^2 (1 + s/6h + V/12hL) for GPT shapes); "mfu_full" the same over the peak.
- "model_tflops_causal": model FLOPs with causal attention counted as the lower triangle (what this planner reports).
- "tokens_per_gpu": tokens per second and GPU (torchtitan's WPS), no FLOP convention needed.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from recipes.config.schema import ClusterConfig, ModelConfig
from recipes.model.shape import model_flops_per_step
from recipes.parallel.layout import Layout
from recipes.planner.assumptions import Assumptions
from recipes.planner.cost import Estimate, estimate

# Clusters as the sources describe them (vendor datasheets for peak and NVLink, formulas.md).
A100_80 = dict(gpus_per_node=8, gpu="A100-80GB", gpu_memory_gb=80, peak_tflops=312, intra_node_gbps=600,
               inter_node_gbps=200)
A100_40 = dict(A100_80, gpu="A100-40GB", gpu_memory_gb=40)
H100 = dict(gpus_per_node=8, gpu="H100-80GB", gpu_memory_gb=80, peak_tflops=989, intra_node_gbps=900,
            inter_node_gbps=400)
# Megatron-LM's stack since mcore 0.7 (its README: --overlap-grad-reduce --overlap-param-gather, --tp-comm-overlap,
# pipeline communication overlapped by default).
MEGATRON_CORE_OVERLAPS = dict(tp_comm_overlap=True, dp_comm_overlap=True, pp_comm_overlap=True)

SOURCES = {
    "megatron-2021": "Narayanan et al. 2021 (SC21), Table 1: A100-80GB, full recompute, hardware TFLOP/s",
    "mcore-weak": "Megatron-LM README, 'Training Speed and Scalability' (images/model_table.png, commit f2e5db4, "
                  "2024-07-15): Megatron-Core r0.8.0, H100, vocabulary 131,072, 4,096 tokens",
    "mcore-strong": "the same README: GPT-3 175B strong-scaled from 96 to 4,608 H100 at 1,152 sequences, MFU 47% "
                    "-> 42%",
    "llama3": "Dubey et al. 2024, 'The Llama 3 Herd of Models', Table 4 (BF16, H100)",
    "glm": "Zeng et al. 2022, 'GLM-130B', Sec. 3 and App. B.4: 96 DGX-A100 40GB, TP4 x PP8, batch 4,224, m = 176, "
           "HFU 43.3%, MFU 32.5%",
    "torchtitan": "torchtitan docs/performance.md (Llama 3 on 64 A100-80GB, FSDP2, local batch 1 or 2): WPS per GPU",
    "mixtral": "Megatron-LM megatron/core/transformer/moe/README.md (MCore v0.8): 'Mixtral 8X7B bf16 ... 438 "
               "TFLOPS', reference mapping 64 H100, TP1 EP8 PP4 VP8, MBS 1, GBS 256, 4,096 tokens",
}


@dataclass(frozen=True)
class PublishedRun:
    name: str
    source: str  # a key of SOURCES
    family: str  # the GPU family whose calibration prices it
    model: dict  # ModelConfig fields
    cluster: dict  # ClusterConfig fields (nodes derived from the layout)
    layout: dict  # Layout fields the source publishes
    global_batch: int
    metric: str  # see the module docstring
    published: float
    role: str  # "fit" or "held_out"
    unpublished: dict = field(default_factory=dict)  # Layout field -> the values tried (the best that fits is priced)
    stack: dict = field(default_factory=dict)  # Assumptions of the publisher's stack (overlaps, attention kernels)
    # The publisher's stack holds no more than the lean activation count: its published settings fit only there
    # (Llama 3 ran TP8 x PP16 without recompute on 80 GB), so an unpublished setting is judged by that count too.
    lean_stack: bool = False
    note: str = ""

    @property
    def gpus(self) -> int:
        lay = self.layout
        return lay.get("tp", 1) * lay.get("cp", 1) * lay.get("pp", 1) * lay["dp"]


def _gpt(layers: int, hidden: int, heads: int, vocab: int, seq: int) -> dict:
    """A GPT shape (learned positions, LayerNorm, GeLU MLP of 4h, biases, tied output layer) as Megatron-LM builds."""
    return dict(num_layers=layers, hidden_size=hidden, num_attention_heads=heads, vocab_size=vocab, seq_length=seq,
                position_embedding="learned", normalization="layernorm", activation="gelu", tied_embeddings=True,
                add_bias_linear=True)


def _llama(layers: int, hidden: int, heads: int, groups: int, ffn: int, vocab: int, seq: int) -> dict:
    return dict(num_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_query_groups=groups,
                ffn_hidden_size=ffn, vocab_size=vocab, seq_length=seq, position_embedding="rope",
                normalization="rmsnorm", activation="swiglu", tied_embeddings=False, add_bias_linear=False)


def _megatron_2021() -> list[PublishedRun]:
    rows = [(1.7, 24, 2304, 24, 1, 1, 32, 512, 137), (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
            (7.5, 32, 4096, 36, 4, 1, 128, 512, 142), (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
            (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138), (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
            (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148), (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
            (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163)]
    return [PublishedRun(
        name=f"GPT {b}B, {n} A100", source="megatron-2021", family="a100", model=_gpt(l, h, a, 51200, 2048),
        cluster=A100_80, layout=dict(tp=t, pp=p, dp=n // (t * p), zero_stage=1, micro_batch=1, recompute="full",
                                     sequence_parallel=False),
        global_batch=batch, metric="hardware_tflops", published=pub, role="fit", stack=dict(flash_attention=False),
        note="pipeline schedule not stated per row: priced as 1F1B")
        for b, a, h, l, t, p, n, batch, pub in rows]


def _megatron_core_weak() -> list[PublishedRun]:
    # (size, heads, hidden, layers, TP, PP, DP, batch, per-GPU TFLOP/s); MFU in the table = TFLOP/s / 989
    rows = [("1.7B", 16, 2048, 24, 1, 1, 48, 192, 408.8), ("7.1B", 32, 4096, 30, 2, 1, 48, 192, 465.9),
            ("16B", 48, 6144, 32, 4, 1, 48, 192, 489.1), ("32B", 56, 7168, 48, 8, 1, 48, 192, 459.6),
            ("70B", 64, 8192, 84, 8, 2, 48, 384, 419.7), ("119B", 80, 10240, 92, 8, 4, 48, 768, 420.5),
            ("177B", 96, 12288, 96, 8, 6, 48, 1152, 432.8), ("314B", 128, 16384, 96, 8, 8, 48, 1536, 474.4),
            ("462B", 144, 18432, 112, 8, 16, 48, 3072, 459.9)]
    return [PublishedRun(
        name=f"GPT {size}, {t * p * d} H100", source="mcore-weak", family="h100", model=_gpt(l, h, a, 131072, 4096),
        cluster=H100, layout=dict(tp=t, pp=p, dp=d, zero_stage=1, sequence_parallel=t > 1), global_batch=batch,
        metric="model_tflops_full", published=pub, role="fit", unpublished=_TUNED, stack=MEGATRON_CORE_OVERLAPS)
        for size, a, h, l, t, p, d, batch, pub in rows]


# What the Megatron-Core tables leave unstated: priced at the best of these that fits (the runs were tuned).
_TUNED = {"micro_batch": (1, 2, 4), "recompute": ("none", "full"),
          "pipeline": (("1f1b", 1), ("interleaved_1f1b", 2), ("interleaved_1f1b", 4), ("interleaved_1f1b", 8))}


def _held_out() -> list[PublishedRun]:
    llama405 = _llama(126, 16384, 128, 8, 53248, 128256, 8192)
    l3 = [(8192, 1, 64, 8192, 32, 430), (16384, 1, 128, 8192, 16, 400), (16384, 16, 8, 131072, 16, 380)]
    runs = [PublishedRun(
        name=f"Llama 3 405B, {n:,} H100, {seq // 1024}K", source="llama3", family="h100",
        model=dict(llama405, seq_length=seq), cluster=H100,
        layout=dict(tp=8, cp=cp, pp=16, dp=dp, zero_stage=1, micro_batch=1, recompute="none",
                    sequence_parallel=True, schedule="interleaved_1f1b"),
        global_batch=dp * per_dp, metric="model_tflops_causal", published=pub, role="held_out",
        stack=dict(lighter_first_stage=1), lean_stack=True,
        unpublished={"pipeline": (("interleaved_1f1b", 2), ("interleaved_1f1b", 4), ("interleaved_1f1b", 7)),
                     **({"recompute": ("none", "full")} if cp > 1 else {})},
        note="interleaved, chunks per rank not stated (best of 2, 4, 7: 126 layers allow at most 7 per rank here); "
             "FSDP priced as ZeRO-1" + ("; recompute not stated for the 128K stage (best of none, full); its DP is 8 "
                                        "(8 x 16 x 16 x 8 = 16,384 GPUs)" if cp > 1 else ""))
        for n, cp, dp, seq, per_dp, pub in l3]
    gpt175 = _gpt(96, 12288, 96, 131072, 4096)
    runs += [PublishedRun(
        name=f"GPT-3 175B, {n:,} H100", source="mcore-strong", family="h100", model=gpt175, cluster=H100,
        layout=dict(tp=8, pp=6, dp=n // 48, zero_stage=1, sequence_parallel=True), global_batch=1152,
        metric="mfu_full", published=mfu, role="held_out", unpublished=_TUNED, stack=MEGATRON_CORE_OVERLAPS,
        note="TP8 x PP6 inferred from the weak-scaling table's 177B row")
        for n, mfu in ((96, 0.47), (4608, 0.42))]
    runs.append(PublishedRun(
        name="GLM-130B, 768 A100-40GB", source="glm", family="a100",
        model=dict(num_layers=70, hidden_size=12288, num_attention_heads=96, ffn_hidden_size=32768,
                   vocab_size=150528, seq_length=2048, position_embedding="rope", normalization="layernorm",
                   activation="swiglu", tied_embeddings=True, add_bias_linear=True),
        cluster=A100_40, layout=dict(tp=4, pp=8, dp=24, zero_stage=1, micro_batch=1, recompute="full",
                                     sequence_parallel=False),
        global_batch=4224, metric="hfu", published=0.433, role="held_out",
        stack=dict(flash_attention=False, lighter_first_stage=1),
        note="DeepSpeed PipeDream-Flush (1F1B); GeGLU priced as a gated MLP of 32,768"))
    runs += _torchtitan()
    runs.append(PublishedRun(
        name="Mixtral 8x7B, 64 H100", source="mixtral", family="h100",
        model=dict(_llama(32, 4096, 32, 8, 14336, 32000, 4096),
                   moe=dict(num_experts=8, top_k=2, ffn_hidden_size=14336)),
        cluster=H100, layout=dict(tp=1, pp=4, dp=16, ep=8, zero_stage=1, micro_batch=1, recompute="none",
                                  schedule="interleaved_1f1b", vpp=8),
        global_batch=256, metric="model_tflops_full", published=438, role="held_out", stack=MEGATRON_CORE_OVERLAPS,
        note="the headline figure of MCore v0.8 beside its reference mapping; dropless, load priced balanced"))
    return runs


def _torchtitan() -> list[PublishedRun]:
    l3_8b = _llama(32, 4096, 32, 8, 14336, 128256, 8192)
    l3_70b = _llama(80, 8192, 64, 8, 28672, 128256, 8192)
    l2_13b = _llama(40, 5120, 40, 40, 13824, 32000, 4096)
    rows = [("Llama 3 8B", l3_8b, 1, "none", 2973, "selective op checkpointing, priced as no recompute"),
            ("Llama 3 70B", l3_70b, 1, "full", 331, "full checkpointing"),
            ("Llama 2 13B", l2_13b, 2, "none", 2162, "no checkpointing")]
    return [PublishedRun(
        name=f"{name}, 64 A100 (FSDP)", source="torchtitan", family="a100", model=model, cluster=A100_80,
        layout=dict(tp=1, pp=1, dp=64, zero_stage=3, micro_batch=b, recompute=r), global_batch=64 * b,
        metric="tokens_per_gpu", published=wps, role="held_out", note=f"FSDP2 priced as ZeRO-3; {note}")
        for name, model, b, r, wps, note in rows]


PUBLISHED: tuple[PublishedRun, ...] = tuple(_megatron_2021() + _megatron_core_weak() + _held_out())


# ---------------------------------------------------------------------------------------------------------------------
# Pricing a published run
# ---------------------------------------------------------------------------------------------------------------------

def run_configs(run: PublishedRun) -> tuple[ModelConfig, ClusterConfig]:
    return ModelConfig(**run.model), ClusterConfig(nodes=max(1, run.gpus // 8), name=f"published-{run.family}",
                                                   **run.cluster)


def candidate_layouts(run: PublishedRun) -> list[Layout]:
    """The published layout, and where a setting is unpublished, every value `run.unpublished` lists."""
    base = dict(run.layout)
    options = [base]
    for key, values in run.unpublished.items():
        grown = []
        for lay in options:
            for v in values:
                change = dict(zip(("schedule", "vpp"), v)) if key == "pipeline" else {key: v}
                grown.append({**lay, **change})
        options = grown
    return [Layout(**o) for o in options]


def price(run: PublishedRun, assume: Assumptions) -> Estimate | None:
    """The run as the planner prices it: among the valid candidates, the fastest of those whose memory verdict is
    best (a layout that fits under Korthikanti's count before one that fits only under the lean count: the team
    tuned within its memory), None when no candidate is valid and held by some stack (a published run ran)."""
    model, cluster = run_configs(run)
    stack = replace(assume, **run.stack)
    ests = [estimate(model, cluster, lay, run.global_batch, assume=stack) for lay in candidate_layouts(run)
            if not lay.problems(model, run.global_batch)]
    held = [e for e in ests if e.fits]
    return min(held, key=lambda e: (e.memory_verdict == "maybe" and not run.lean_stack, -e.tokens_per_s),
               default=None)


def in_published_units(run: PublishedRun, e: Estimate) -> float:
    """The estimate in the unit and FLOP count the source published (see the module docstring)."""
    model, cluster = run_configs(run)
    step, n, B = e.time_s["step"], run.gpus, run.global_batch
    if run.metric == "tokens_per_gpu":
        return e.tokens_per_s / n
    if run.metric in ("hardware_tflops", "hfu"):  # what the kernels execute (the stack's attention kernels)
        hw = e.hardware_tflops_per_gpu
        return hw if run.metric == "hardware_tflops" else hw / cluster.peak_tflops
    if run.metric in ("model_tflops_full", "mfu_full"):
        full = model_flops_per_step(model, B, causal=False) / step / n / 1e12
        return full if run.metric == "model_tflops_full" else full / cluster.peak_tflops
    if run.metric == "model_tflops_causal":
        return e.tflops_per_gpu
    raise ValueError(f"unknown metric {run.metric}")


def predicted(run: PublishedRun, assume: Assumptions) -> float:
    e = price(run, assume)
    if e is None:
        raise ValueError(f"{run.name}: no candidate layout is valid")
    return in_published_units(run, e)


def runs_for(family: str, role: str | None = None) -> list[PublishedRun]:
    return [r for r in PUBLISHED if r.family == family and (role is None or r.role == role)]


# ---------------------------------------------------------------------------------------------------------------------
# The published calibration of each GPU family
# ---------------------------------------------------------------------------------------------------------------------

# The terms fitted per family, on its "fit" runs. The A100 runs (nine layouts from TP1 to TP8 x PP35) fix the GEMM
# shape terms; the H100 runs keep gemm_falloff from them and fit the kernels' share of peak, the element-wise work
# (memory-bound ops weigh more on a chip with 3x the FLOP/s and 1.7x the bandwidth) and how much of TP/DP/PP
# traffic Megatron-Core's overlap hides. The attention kernels' share of peak is cited, not fitted (Assumptions):
# the fit runs' attention is too small a share of their FLOPs to tell it apart (an H100 fit of it runs to its bound).
FIT_TERMS = {"a100": ("kernel_efficiency", "gemm_falloff", "elementwise_hidden"),
             "h100": ("kernel_efficiency", "elementwise_hidden", "overlap_efficiency")}
FIT_ORDER = ("a100", "h100")


def refit() -> dict[str, Assumptions]:
    """Fit every family's terms to its published "fit" runs (a100 first: h100 keeps its gemm_falloff)."""
    from recipes.planner.calibration import fit

    fitted: dict[str, Assumptions] = {}
    base = Assumptions()
    for family in FIT_ORDER:
        train = runs_for(family, "fit")
        fitted[family] = fit(lambda a, train=train: [predicted(r, a) for r in train], [r.published for r in train],
                             FIT_TERMS[family], base)
        base = replace(base, gemm_falloff=fitted[family].gemm_falloff)
    return fitted


@dataclass(frozen=True)
class Row:
    """One row of the calibration table: a run, its published figure, the uncalibrated and calibrated predictions."""
    run: PublishedRun
    before: float  # with the constants the planner had before calibration (Assumptions())
    after: float  # with the family's calibration file
    layout: Layout  # the layout priced (with the best unpublished settings)
    memory_verdict: str

    @property
    def error(self) -> float:
        return self.after / self.run.published - 1

    @property
    def error_before(self) -> float:
        return self.before / self.run.published - 1


def table(calibrated: dict[str, Assumptions]) -> list[Row]:
    """Every published run priced before and after calibration."""
    rows = []
    for run in PUBLISHED:
        after = price(run, calibrated[run.family])
        rows.append(Row(run=run, before=predicted(run, Assumptions()), after=in_published_units(run, after),
                        layout=after.layout, memory_verdict=after.memory_verdict))
    return rows


def write_published_calibrations(directory=None) -> dict[str, Assumptions]:
    """Refit every family and write configs/clusters/calibration/<family>.yaml (docs/make_planner_doc.py --refit)."""
    from recipes.planner.calibration import CALIBRATION_DIR, fitted_terms, write_calibration

    directory = directory or CALIBRATION_DIR
    fitted = refit()
    rows = table(fitted)
    for family, assume in fitted.items():
        mine = [r for r in rows if r.run.family == family]
        section = {"applies_to": family,
                   "fitted_on": "published runs (" + ", ".join(sorted({r.run.source for r in mine
                                                                       if r.run.role == 'fit'})) + ")",
                   "terms": fitted_terms(assume, FIT_TERMS[family] + (("gemm_falloff",) if family != "a100" else ())),
                   "runs": [{"run": r.run.name, "role": r.run.role, "source": r.run.source,
                             "published": r.run.published, "predicted": round(r.after, 4),
                             "error": round(r.error, 4)} for r in mine]}
        header = (f"# The cost model's efficiency terms for {family.upper()} GPUs, fitted to published runs by\n"
                  "# `docs/make_planner_doc.py --refit` (recipes/planner/published.py: the runs, their sources, what was\n"
                  "# fitted and what was held out). `recipes plan` applies it to every cluster of this GPU family\n"
                  "# that has no calibration of its own (`recipes plan --calibrate RUN_DIR...` makes one).\n")
        write_calibration(directory / f"{family}.yaml", section, header)
    return fitted


def stored_calibrations() -> dict[str, Assumptions]:
    """Each family's terms as committed in configs/clusters/calibration/ (what `recipes plan` applies)."""
    from recipes.planner.calibration import CALIBRATION_DIR, read_calibration

    return {f: replace(Assumptions(), **read_calibration(CALIBRATION_DIR / f"{f}.yaml").terms) for f in FIT_ORDER}
