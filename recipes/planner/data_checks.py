"""The training data of a recipe, checked before any process starts: named at all, every manifest present and
readable, its shards on disk, one tokenizer whose vocabulary fits `model.vocab_size`.

It reads what `recipes.train.data.load_blend` will read (data_prep manifest.json files, `data_prep blend` outputs,
explicit data.blend prefixes, per data stage or for the whole run), but only checks: a problem names the recipe field
and the file, and says what to run to fix it. The JSON is read with `json` (never executed, never unpickled).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from recipes.config.problem import Problem
from recipes.planner.split_checks import empty_split_message, manifest_documents

MANIFEST = "manifest.json"
_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


@dataclass(frozen=True)
class _Tokenizer:
    vocab_size: int
    eod_id: int
    where: str  # the manifest it came from


def rebuild_command(out_dir: Path) -> str:
    """The data_prep command that (re)writes `out_dir`'s manifest: the same tokenize run again skips every unit whose
    shard is complete and writes manifest.json last. The inputs come from the units' stats files when there are
    any; the tokenizer is not recorded there, so it stays a placeholder."""
    inputs: list[str] = []
    for stats in sorted(out_dir.glob("shard_*.stats.json"))[:2000]:
        try:
            pieces = json.loads(stats.read_text()).get("inputs") or []
        except (OSError, ValueError, AttributeError):
            continue
        inputs += [p["path"] for p in pieces if isinstance(p, dict) and p.get("path") not in inputs]
    shown = " ".join(inputs) if 0 < len(inputs) <= 4 else (os.path.commonpath(inputs) if inputs else "INPUTS")
    return f"python -m data_prep tokenize {shown} -o {out_dir} -t TOKENIZER"


def _manifest_file(entry: str) -> Path:
    p = Path(entry)
    return p / MANIFEST if p.is_dir() or not p.suffix else p


def _missing_manifest(field: str, entry: str, path: Path) -> Problem:
    folder = path.parent
    done = list(folder.glob("shard_*.stats.json")) if folder.is_dir() else []
    if done:
        failed = folder / "failed_units.json"
        state = (f"{len(done)} unit(s) of a data_prep run are complete there but it wrote no manifest"
                 + (f" ({failed} lists the units that failed)" if failed.is_file() else " (it is still running, "
                    "was stopped, or other slices have not finished)"))
        return Problem(field, f"{field} = {entry}: {path} not found; {state}",
                       f"finish the run: `{rebuild_command(folder)}` (completed units are skipped)")
    return Problem(field, f"{field} = {entry}: {path} not found", "build it with "
                   f"`python -m data_prep tokenize INPUTS -o {folder} -t TOKENIZER`, or fix the path")


def _read_json(field: str, entry: str, path: Path) -> tuple[dict | None, Problem | None]:
    if _URL.match(entry):
        return None, Problem(field, f"{field} = {entry}: training reads manifests from a file system",
                             "copy the shards to (or mount them on) a path every node sees, and name that path")
    if not path.is_file():
        return None, _missing_manifest(field, entry, path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        return None, Problem(field, f"{field}: {path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg})",
                             f"rewrite it: `{rebuild_command(path.parent)}` (completed units are kept)")
    except (OSError, UnicodeDecodeError) as e:
        return None, Problem(field, f"{field}: {path}: cannot be read ({e})", "check the file and its permissions")
    if not isinstance(data, dict):
        return None, Problem(field, f"{field}: {path} is not a data_prep manifest (a JSON object with tokenizer "
                             f"and shards)", f"point {field} at the manifest.json data_prep wrote")
    return data, None


def _tokenizer(field: str, path: Path, record) -> tuple[_Tokenizer | None, Problem | None]:
    try:
        return _Tokenizer(int(record["vocab_size"]), int(record["eod_id"]), str(path)), None
    except (KeyError, TypeError, ValueError):
        return None, Problem(field, f"{field}: {path} has no tokenizer record with vocab_size and eod_id",
                             f"rewrite it with this repository's data_prep: `{rebuild_command(path.parent)}`")


def _shard_problems(field: str, path: Path, prefixes: list[str]) -> list[Problem]:
    missing = [p for p in prefixes if not (Path(p + ".bin").is_file() and Path(p + ".idx").is_file())]
    if not missing:
        return []
    names = ", ".join(Path(p).name for p in missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    folder = Path(missing[0]).parent
    return [Problem(field, f"{field}: {len(missing)} of the {len(prefixes)} shards {path} lists lack their .bin/.idx "
                    f"({names}, under {folder})", f"copy them back, or rebuild: `{rebuild_command(folder)}`")]


def check_manifest(field: str, entry: str) -> tuple[_Tokenizer | None, list[Problem]]:
    """One data.manifests entry (a manifest.json, its directory, or a `data_prep blend` output)."""
    path = _manifest_file(entry)
    data, problem = _read_json(field, entry, path)
    if problem:
        return None, [problem]
    if data.get("sources"):  # a `data_prep blend` output: weighted sources with absolute prefixes
        first = data["sources"][0].get("path", "") if isinstance(data["sources"][0], dict) else ""
        tok, problems = check_manifest(f"{field} (source {first})", first) if first else (None, [])
        prefixes = [str(p) for p in (data.get("blend") or [])[1::2]]
        return tok, problems + _shard_problems(field, path, prefixes)
    tok, problem = _tokenizer(field, path, data.get("tokenizer"))
    if problem:
        return None, [problem]
    shards = [s for s in (data.get("shards") or []) if isinstance(s, dict) and s.get("prefix")]
    if not shards:
        totals = data.get("totals") or {}
        rejected = totals.get("rejected") or {}
        top = max(rejected, key=rejected.get) if rejected else None
        why = f"; {sum(rejected.values()):,} record(s) rejected, most for '{top}'" if top else ""
        return tok, [Problem(field, f"{field}: {path} holds no shards ({totals.get('documents', 0)} documents{why})",
                             "tokenize data that yields documents (a wrong --text-field rejects every record as "
                             f"missing_text; the reasons are in {path.parent}/rejects*), then point here again")]
    return tok, _shard_problems(field, path, [str(path.parent / s["prefix"]) for s in shards])


def _split_problems(field: str, entry: str, split: str) -> list[Problem]:
    """A train or validation split with no document of this manifest (recipes.planner.split_checks)."""
    path = _manifest_file(entry)
    documents = manifest_documents(path)
    found = empty_split_message(field, path, split, documents) if documents else None
    return [Problem("data.split", *found)] if found else []


def _sources(data) -> list[tuple[str, list[str], list]]:
    """(field prefix, manifests, blend) for the run and each data stage."""
    out = [("data", list(data.manifests), list(data.blend))]
    out += [(f"data.stages.{i}" + (f" ({s.name})" if s.name else ""), list(s.manifests), list(s.blend))
            for i, s in enumerate(data.stages)]
    return out


def data_problems(recipe) -> list[Problem]:
    """Every problem with the recipe's training data (empty: `recipes.train.data` will find it all)."""
    sources = _sources(recipe.data)
    if not any(manifests or blend for _, manifests, blend in sources):
        return [Problem("data.manifests", "data: the recipe names no training data (data.manifests, data.blend and "
                        "data.stages are all empty)", "set data.manifests=[DIR/manifest.json], the manifest that "
                        "`python -m data_prep tokenize INPUTS -o DIR -t TOKENIZER` writes")]
    problems: list[Problem] = []
    tokenizers: list[_Tokenizer] = []
    for prefix, manifests, blend in sources:
        for i, entry in enumerate(manifests):
            tok, found = check_manifest(f"{prefix}.manifests[{i}]", entry)
            problems += found or _split_problems(f"{prefix}.manifests[{i}]", entry, recipe.data.split)
            tokenizers += [tok] if tok else []
        if blend:
            problems += _shard_problems(f"{prefix}.blend", Path("data.blend"), [str(p) for _, p in blend])
            if not manifests and not recipe.data.manifests:
                problems.append(Problem(f"{prefix}.blend", f"{prefix}.blend is given without manifests: the "
                                        "tokenizer's end-of-document id is unknown",
                                        f"add the manifest the prefixes come from to {prefix}.manifests"))
    problems += _tokenizer_problems(recipe, tokenizers)
    if recipe.data.tokenizer and not _URL.match(recipe.data.tokenizer) and not Path(recipe.data.tokenizer).exists():
        problems.append(Problem("data.tokenizer", f"data.tokenizer = {recipe.data.tokenizer}: not found",
                                "point it at the tokenizer the manifests were written with (a sentencepiece .model, "
                                "a tokenizer.json or a transformers directory), or remove it"))
    return problems


def _tokenizer_problems(recipe, tokenizers: list[_Tokenizer]) -> list[Problem]:
    if not tokenizers:
        return []
    first = tokenizers[0]
    out = [Problem("data.manifests", f"data: the tokenizer of {t.where} (vocabulary {t.vocab_size}, end-of-document "
                   f"{t.eod_id}) differs from that of {first.where} (vocabulary {first.vocab_size}, end-of-document "
                   f"{first.eod_id})", "tokenize every source with one tokenizer")
           for t in tokenizers[1:] if (t.vocab_size, t.eod_id) != (first.vocab_size, first.eod_id)]
    need = max(t.vocab_size for t in tokenizers)
    have = recipe.model.vocab_size
    if need > have:
        where = next(t.where for t in tokenizers if t.vocab_size == need)
        out.append(Problem("model.vocab_size", f"model.vocab_size = {have} is smaller than the vocabulary of the "
                           f"tokenizer {where} was written with ({need} ids): token ids >= {have} have no embedding",
                           f"set model.vocab_size={need} (Megatron pads it to a multiple of "
                           f"{recipe.model.make_vocab_size_divisible_by} x tp), or tokenize with a tokenizer of at most "
                           f"{have} ids"))
    return out
