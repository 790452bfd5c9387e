"""Training data: data_prep manifests -> megatron-core BlendedMegatronDatasetBuilder + GPTDataset -> micro-batches.

Samples are addressed by the global count of samples consumed so far, so resuming from a checkpoint (which stores
that count) continues with exactly the next samples whatever happened before. Within one optimizer step the global
batch is laid out DP-rank-major: DP rank r takes samples [consumed + r * m * b, consumed + (r + 1) * m * b), split
into m micro-batches of b, so every layout with the same global batch sees the same samples in each step.

With `model.document_mask` the GPTDataset restarts position ids after each EOD (megatron-core's reset_position_ids)
and the micro-batches carry them: ((tokens, position_ids), (labels, loss_mask)). The attention derives each token's
document from them (`recipes.model.layers.document_ids`), so no s x s mask is built or moved in the data path.

manifest.json (written by data_prep):
  {"tokenizer": {"vocab_size": N, "eod_id": N, "pad_id": N|null, ...}, "dtype": "uint16",
   "shards": [{"prefix": "<relative to the manifest dir>", "tokens": N, ...}], "blend": [w0, "prefix0", ...]}
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

from data_prep.steps.tokenizers import TokenizerInfo
from recipes.train.data_cache import cache_subdir, no_pickle_loads, pickle_refusal, shard_identity, verify_cache
from recipes.train.shard_set import ShardSet, build_index, set_path


class DataError(ValueError):
    """A data problem the user can fix (missing manifest, vocabulary mismatch, ...)."""


@dataclass
class DatasetTokenizer:
    """What megatron-core's GPTDataset asks of a tokenizer (eod, pad, vocab_size, unique_identifiers), made from the
    manifest's tokenizer record (data_prep's `TokenizerInfo`, the one description of a tokenizer)."""

    vocab_size: int
    eod: int
    pad: int = -1  # megatron: "no pad token" is any id outside the vocabulary
    unique_identifiers: dict = field(default_factory=dict)

    @classmethod
    def from_manifest(cls, tok: dict, source: str) -> "DatasetTokenizer":
        try:
            info = TokenizerInfo.from_manifest(tok)
        except (KeyError, TypeError) as e:
            raise DataError(f"{source}: tokenizer.{e} missing; re-run data_prep to write a complete manifest") from None
        ident = {"vocab_size": info.vocab_size, "eod": info.eod_id, "type": tok.get("type"), "path": tok.get("path")}
        return cls(vocab_size=info.vocab_size, eod=info.eod_id, pad=-1 if info.pad_id is None else info.pad_id,
                   unique_identifiers=ident)


@dataclass
class Blend:
    prefixes: list[str]
    weights: list[float]
    tokenizer: DatasetTokenizer
    # per prefix: the source (manifest) it came from, whose shards may be read as one concatenation (their weights
    # are proportional to their tokens); None for data.blend's prefixes, each blended on its own
    sources: list = field(default_factory=list)
    recorded: dict = field(default_factory=dict)  # prefix -> (sha256 of .idx, of .bin) as the manifest recorded


def _manifest_path(entry: str) -> Path:
    p = Path(entry)
    if p.is_dir():
        p = p / "manifest.json"
    if not p.is_file():
        raise DataError(f"data.manifests: '{entry}' has no manifest.json; run data_prep first or fix the path")
    return p


def _blend_tokenizer(m: dict, path: Path) -> dict:
    """A `data_prep blend` file (weighted sources, absolute prefixes) names no tokenizer: take its first source's."""
    sources = m.get("sources") or []
    if not sources:
        return {}
    return json.loads(_manifest_path(sources[0]["path"]).read_text()).get("tokenizer") or {}


def load_blend(recipe, source=None) -> Blend:
    """Prefixes and weights from data.blend, or from each entry of data.manifests: a data_prep manifest.json (weights =
    tokens) or a `data_prep blend` output (weights as blended, prefixes absolute). `source`: a data stage, whose own
    manifests / blend replace data's when it has any."""
    d = source if source is not None and (source.manifests or source.blend) else recipe.data
    tokenizer = None
    prefixes: list[str] = []
    weights: list[float] = []
    sources: list = []
    recorded: dict = {}
    for entry in d.manifests:
        path = _manifest_path(entry)
        m = json.loads(path.read_text())
        tok = DatasetTokenizer.from_manifest(m.get("tokenizer") or _blend_tokenizer(m, path), str(path))
        if tokenizer is not None and (tok.vocab_size, tok.eod) != (tokenizer.vocab_size, tokenizer.eod):
            raise DataError(f"{path}: tokenizer (vocab {tok.vocab_size}, eod {tok.eod}) differs from the first "
                            f"manifest's (vocab {tokenizer.vocab_size}, eod {tokenizer.eod}); use one tokenizer")
        tokenizer = tokenizer or tok
        blend = m.get("blend") or [x for s in m.get("shards", []) for x in (s["tokens"], s["prefix"])]
        for sh in m.get("shards", []):
            recorded[str((path.parent / sh["prefix"]).resolve())] = (sh.get("sha256_idx"), sh.get("sha256_bin"))
        for w, prefix in zip(blend[0::2], blend[1::2]):
            prefixes.append(str((path.parent / prefix).resolve()))
            weights.append(float(w))
            # a blend file's prefixes are absolute, one source per directory; a manifest's shards are one source
            sources.append(str(Path(prefixes[-1]).parent) if m.get("sources") else str(path))
    if d.blend:
        prefixes = [p for _, p in d.blend]
        weights = [float(w) for w, _ in d.blend]
        sources = [None] * len(prefixes)
    if not prefixes:
        raise DataError("data: no shards; set data.manifests to data_prep's manifest.json (or data.blend)")
    for p in prefixes:
        if not (Path(p + ".bin").is_file() and Path(p + ".idx").is_file()):
            raise DataError(f"data: shard '{p}' lacks its .bin/.idx; re-run data_prep or fix the manifest")
    if tokenizer is None:
        raise DataError("data.blend given without data.manifests: add the manifest so the tokenizer's eod is known")
    if tokenizer.vocab_size > recipe.model.vocab_size:
        raise DataError(f"model.vocab_size = {recipe.model.vocab_size} < the tokenizer's {tokenizer.vocab_size}; "
                        f"set model.vocab_size >= {tokenizer.vocab_size}")
    return Blend(prefixes, weights, tokenizer, sources, recorded)


def build_datasets(recipe, train_samples: int, valid_samples: int, cache_dir: str, source=None):
    """(train, valid) GPTDatasets (of data stage `source` when given). The shards of one manifest are one low-level
    dataset (shard_set.py: seconds over 10,000 shards); the index cache lives under a directory keyed on the shards'
    identity and every file in it is checked before megatron-core opens it (data_cache.py). Global rank 0 builds the
    caches first, the others then read them."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig

    blend = load_blend(recipe, source)
    verify_shards(blend, full=recipe.data.verify == "full")
    cache = cache_subdir(cache_dir, shard_identity(blend.prefixes, blend.recorded))
    cache.mkdir(parents=True, exist_ok=True)
    no_pickle_loads()
    verify_cache(cache, repair=_rank() == 0)
    paths, weights = _low_level_paths(blend, cache)
    config = GPTDatasetConfig(
        random_seed=recipe.training.seed,
        sequence_length=recipe.model.seq_length,
        blend=(paths, weights),
        split=recipe.data.split,
        path_to_cache=str(cache),
        tokenizer=blend.tokenizer,
        reset_position_ids=recipe.model.document_mask,
        reset_attention_mask=False,  # would build an s x s mask per sample; the model derives it from the positions
        eod_mask_loss=False,
        create_attention_mask=False,
    )
    try:
        train, valid, _ = BlendedMegatronDatasetBuilder(
            shard_set_gpt_dataset(), [train_samples, valid_samples, 0], lambda: True, config).build()
    except ValueError as e:
        why = pickle_refusal(e, cache)
        if why:
            raise DataError(why) from None
        raise
    return train, valid


def verify_shards(blend: Blend, full: bool) -> None:
    """Collective: the shards are the ones their manifests record (data.verify: "index" checks each .idx's sha256
    and the .bin size it implies, ~0.01 s per GB; "full" each .bin's sha256 too, ~0.75 s per GB, spread over the
    ranks). Every rank raises if any rank found one damaged (the damaged file is named on the rank that found it)."""
    from data_prep.write.verify import ShardIntegrityError, verify_recorded

    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    problem = None
    try:
        verify_recorded(blend.prefixes, blend.recorded, full=full, share=(_rank(), world) if full else (0, 1))
    except ShardIntegrityError as e:
        problem = str(e)
    if world > 1:
        nccl = torch.distributed.get_backend() == "nccl"  # NCCL moves CUDA tensors only
        flag = torch.tensor([1.0 if problem else 0.0], device=f"cuda:{torch.cuda.current_device()}" if nccl else "cpu")
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        if flag.item() and problem is None:
            problem = "another rank found a damaged shard (see its error above)"
    if problem:
        raise DataError(problem)


def _rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def _low_level_paths(blend: Blend, cache: Path) -> tuple[list[str], list[float]]:
    """The blend megatron-core sees: each source's shards as one ShardSet (its index built once, by rank 0 first),
    data.blend's prefixes as they are."""
    groups: dict = {}
    for prefix, weight, src in zip(blend.prefixes, blend.weights, blend.sources or [None] * len(blend.prefixes)):
        key = src if src is not None else ("prefix", prefix)
        groups.setdefault(key, ([], []))
        groups[key][0].append(prefix)
        groups[key][1].append(weight)
    paths, weights = [], []
    for key, (prefixes, ws) in groups.items():
        if isinstance(key, tuple):
            paths.append(prefixes[0])
        else:
            path = set_path(cache, prefixes, shard_identity(prefixes, blend.recorded))
            _build_first_on_rank0(path, prefixes)
            SHARD_SETS[str(path)] = list(prefixes)
            paths.append(str(path))
        weights.append(sum(ws))
    return paths, weights


# shard-set index dir -> the manifest's shards it indexes, for the datasets this process builds
SHARD_SETS: dict[str, list[str]] = {}


def _build_first_on_rank0(path: Path, prefixes: list[str]) -> None:
    """Rank 0 builds the index, then the others find it (a shared cache) or build it once per node (a node-local
    one: the first rank there takes the lock, the rest wait and find it done)."""
    try:
        if _rank() == 0:
            build_index(path, prefixes)
        if torch.distributed.is_initialized():
            torch.distributed.barrier()
        build_index(path, prefixes)
    except ValueError as e:
        raise DataError(str(e)) from None


@functools.lru_cache(maxsize=1)
def shard_set_gpt_dataset():
    """megatron-core's GPTDataset whose low-level dataset is a ShardSet when its path is one (else an
    IndexedDataset, as megatron-core builds it). Made on first use: importing megatron-core takes seconds."""
    from megatron.core.datasets.gpt_dataset import GPTDataset

    class ShardSetGPTDataset(GPTDataset):
        @staticmethod
        def build_low_level_dataset(dataset_path: str, config):
            if dataset_path in SHARD_SETS:
                return ShardSet(Path(dataset_path), SHARD_SETS[dataset_path])
            return GPTDataset.build_low_level_dataset(dataset_path, config)

    return ShardSetGPTDataset


def collate(items: list[dict], positions: bool):
    """GPTDataset items -> one micro-batch on CPU: (tokens, (labels, loss_mask)), or ((tokens, position_ids), ...)."""
    def stack(key, dtype):
        return torch.stack([torch.as_tensor(x[key]) for x in items]).to(dtype)

    tokens = stack("tokens", torch.long)
    inputs = (tokens, stack("position_ids", torch.long)) if positions else tokens
    return inputs, (stack("labels", torch.long), stack("loss_mask", torch.float))


class _StepSampler(torch.utils.data.Sampler):
    """Micro-batches of sample indices for this DP rank, step after step from `consumed` on (endless).

    It holds plain numbers, not its MicroBatches: a reference back would make a cycle (MicroBatches -> iterator ->
    DataLoader -> sampler -> MicroBatches), so a replaced iterator would keep its worker processes until the cyclic
    garbage collector ran, and then stop them inside whatever step that happened to be (tens of seconds measured)."""

    def __init__(self, indices, global_batch: int, consumed: int):
        self.indices, self.global_batch, self.consumed = indices, global_batch, consumed

    def __iter__(self):
        consumed = self.consumed
        while True:
            yield from self.indices(consumed)
            consumed += self.global_batch


def step_indices(consumed: int, dp_rank: int, micro_batch: int, grad_accum: int, n: int) -> list[list[int]]:
    """grad_accum lists of micro_batch sample indices: rank dp_rank's share of the step at `consumed` (of n)."""
    start = consumed + dp_rank * micro_batch * grad_accum
    return [[(start + j * micro_batch + i) % n for i in range(micro_batch)] for j in range(grad_accum)]


class MicroBatches:
    """The micro-batches of one optimizer step for this DP rank, addressed by consumed-sample count.

    num_workers > 0: a torch DataLoader whose workers read the following micro-batches while the step runs. Its
    sampler yields exactly the indices `indices` gives, so batches are the same as in-process; it keeps running while
    steps follow one another (consumed advancing by global_batch) and restarts at any other `consumed` (resume, each
    evaluation from the start of the validation split).
    """

    def __init__(self, dataset, micro_batch: int, grad_accum: int, dp_rank: int, dp_size: int,
                 device: torch.device, positions: bool = False, num_workers: int = 0):
        self.dataset = dataset
        self.micro_batch = micro_batch
        self.grad_accum = grad_accum
        self.dp_rank = dp_rank
        self.global_batch = micro_batch * grad_accum * dp_size
        self.device = device
        self.positions = positions
        self.num_workers = num_workers
        self._loader = None  # the running DataLoader iterator (num_workers > 0)
        self._next = None  # the consumed count it continues from

    def indices(self, consumed: int) -> list[list[int]]:
        """grad_accum lists of micro_batch sample indices: this rank's share of the step at `consumed`."""
        return step_indices(consumed, self.dp_rank, self.micro_batch, self.grad_accum, len(self.dataset))

    def _to_device(self, batch):
        (inputs, (labels, mask)) = batch
        move = partial(torch.Tensor.to, device=self.device, non_blocking=self.device.type == "cuda")
        inputs = tuple(map(move, inputs)) if isinstance(inputs, tuple) else move(inputs)
        return inputs, (move(labels), move(mask))

    def _batches_from(self, consumed: int):
        if self.num_workers == 0:
            for idx in self.indices(consumed):
                yield collate([self.dataset[i] for i in idx], self.positions)
            return
        if self._loader is None or self._next != consumed:
            self._loader = None  # let the old workers go before new ones start
            self._loader = iter(torch.utils.data.DataLoader(
                self.dataset, num_workers=self.num_workers, batch_sampler=_StepSampler(
                    partial(step_indices, dp_rank=self.dp_rank, micro_batch=self.micro_batch,
                            grad_accum=self.grad_accum, n=len(self.dataset)), self.global_batch, consumed),
                collate_fn=partial(collate, positions=self.positions), pin_memory=self.device.type == "cuda"))
        self._next = None  # a step abandoned half-way must not be continued
        for _ in range(self.grad_accum):
            yield next(self._loader)
        self._next = consumed + self.global_batch

    def step(self, consumed: int):
        """Yields grad_accum (inputs, (labels, loss_mask)) for the step that starts at global sample `consumed`."""
        for batch in self._batches_from(consumed):
            yield self._to_device(batch)
