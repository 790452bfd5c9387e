"""ZeRO-3 module by module: every module's weights all-gathered before its forward and again before its backward,
gradients reduce-scattered after its backward, fetches prefetched behind the modules before them as far as DeepSpeed's
prefetch bucket reaches; what the compute does not hide is priced."""
from __future__ import annotations

from recipes.model.shape import norm_params
from recipes.parallel.layout import Layout
from recipes.planner.assumptions import Assumptions
from recipes.planner.links import Link


def zero3_modules(model_cfg, tp: int, causal: bool = False) -> tuple[list, list, list]:
    """The modules ZeRO-3 fetches one by one in a forward pass, as (parameters per GPU, share of the forward FLOPs):
    (before the layers, one decoder layer, after the layers). recipes/parallel/ds_config.py sets
    stage3_param_persistence_threshold 0, so every module with parameters (norms included) is gathered before it
    runs and released after."""
    h, heads, L = model_cfg.hidden_size, model_cfg.num_attention_heads, model_cfg.num_layers
    f, s = model_cfg.ffn_size, model_cfg.seq_length
    qkv = h * (h + 2 * model_cfg.query_groups * (h // heads))
    fc1 = h * f * (2 if model_cfg.activation == "swiglu" else 1)
    vocab = model_cfg.padded_vocab_size(tp) * h
    norm = norm_params(model_cfg)
    attention = 2 * s * h * (0.5 if causal else 1.0)  # QK^T and scores x V per token, with the projection after
    total = L * (qkv + h * h + attention + fc1 + f * h) + vocab
    layer = [(norm, 0.0), (qkv / tp, qkv / total), (h * h / tp, (h * h + attention) / total), (norm, 0.0),
             (fc1 / tp, fc1 / total), (f * h / tp, f * h / total)]
    head = 0.0 if model_cfg.tied_embeddings else vocab / tp
    return [(vocab / tp, 0.0)], layer, [(norm, 0.0), (head, vocab / total)]


class _FetchPass:
    """One pass over modules as DeepSpeed's ZeRO-3 coordinator runs it: when module k starts, it prefetches the
    modules after it until their parameters reach the prefetch bucket (at least the next one, even when that alone
    exceeds it); fetches run one after another on the communication stream; module k computes once it is fetched and
    the one before it is done."""

    def __init__(self, bucket_elements: float):
        self.bucket = bucket_elements
        self.comm_free = self.compute_end = self.work = 0.0
        self.starts: list[float] = []
        self.elems: list[float] = []
        self.reach = 1  # the furthest back (in modules) a fetch has been issued from

    def _issued_at(self, j: int) -> float:
        """When module j's fetch can be issued: the start of the earliest module k < j whose prefetch reaches it
        (the modules strictly between k and j hold fewer elements than the bucket)."""
        if j == 0:
            return 0.0
        k, between = j - 1, 0.0
        while k > 0 and between + self.elems[k] < self.bucket:
            between += self.elems[k]
            k -= 1
        self.reach = max(self.reach, j - k)
        return self.starts[k]

    def run(self, modules: list[tuple[float, float, float]]) -> None:
        """modules: (elements, fetch seconds, compute seconds) in the order they run."""
        for elems, fetch, work in modules:
            j = len(self.starts)
            self.elems.append(elems)
            self.comm_free = max(self.comm_free, self._issued_at(j)) + fetch
            self.starts.append(max(self.compute_end, self.comm_free))
            self.compute_end = self.starts[-1] + work
            self.work += work

    @property
    def waited(self) -> float:
        return max(self.compute_end, self.comm_free) - self.work

    def state(self) -> tuple:
        """Everything the next modules' times depend on, relative to now (the end of the last compute)."""
        t = self.compute_end
        return (self.comm_free - t,) + tuple(x - t for x in self.starts[-(self.reach + 1):])


def _same_state(a: tuple, b: tuple, scale: float) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= 1e-12 * (1.0 + scale) for x, y in zip(a, b))


def _pass_wait(before: list, layer: list, after: list, layers: int, bucket_elements: float) -> float:
    """Seconds waited over [before, layer x layers, after]. The layers are identical: once a layer leaves the pass in
    the same state (relative to its end) as the layer before it did, every later layer repeats it shifted in time, so
    the rest are counted at that layer's wait instead of simulated (exact)."""
    sim = _FetchPass(bucket_elements)
    sim.run(before)
    previous = None
    for done in range(1, layers + 1):
        waited = sim.waited
        sim.run(layer)
        state = sim.state()
        if previous is not None and _same_state(state, previous, sim.compute_end):
            per_layer = sim.waited - waited
            sim.run(after)
            return sim.waited + (layers - done) * per_layer
        previous = state
    sim.run(after)
    return sim.waited


def zero3_exposed_seconds(model_cfg, layout: Layout, link: Link, t_model_mb: float, t_recompute_mb: float,
                          act_bytes: int, assume: Assumptions) -> float:
    """ZeRO-3's wait per micro-batch, module by module: each module's weights are all-gathered (one collective,
    one latency per ring step) before its forward and again before its backward, its gradients reduce-scattered
    after its backward (in reduce buckets); a fetch hides behind the modules running before it, as far as the
    prefetch bucket reaches. What is left waits: the first fetches, and every fetch slower than the compute it
    overlaps."""
    parts = zero3_modules(model_cfg, layout.tp, assume.flash_attention)
    bwd_work = t_model_mb * 2 / 3 + t_recompute_mb

    def forward(mods):
        return [(e, link.seconds(e * act_bytes, "all_gather"), x * t_model_mb / 3) for e, x in mods]

    def backward(mods):  # in reverse; the gradients' reduce-scatter shares the link with the next fetches
        return [(e, link.seconds(e * act_bytes, "all_gather")
                 + link.seconds(e * act_bytes, "reduce_scatter", calls=e / assume.bucket_elements), x * bwd_work)
                for e, x in mods[::-1]]

    L, bucket = model_cfg.num_layers, assume.zero3_bucket_elements
    return (_pass_wait(*map(forward, parts), L, bucket)
            + _pass_wait(*map(backward, parts[::-1]), L, bucket))
