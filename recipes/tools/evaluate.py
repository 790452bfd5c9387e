"""Downstream evaluation with lm-evaluation-harness (the `lm-eval` package, its HF backend) on an export or a checkpoint.

    python -m recipes evaluate --model HF_DIR [--tasks recipes_mc,recipes_ppl] [--limit N] [--out results.json]
    python -m recipes evaluate --checkpoint CKPT_DIR [--tag global_stepN] [--config RECIPE overrides...] ...
        [--text FILE] [--include-path DIR] [--device cpu|cuda:0] [--batch-size 8] [--dtype float32|bfloat16]
        [--log-metrics LOGDIR/metrics.jsonl --step N] [--tensorboard LOGDIR/tensorboard]

Nothing is downloaded: HF_DATASETS_OFFLINE / HF_HUB_OFFLINE are set before lm-eval and datasets load, and the default
tasks are local (recipes/tools/eval_tasks: an in-domain (Python) multiple-choice task and a perplexity task over a local text
file, both `dataset_path: json` over files shipped next to their YAML). `--text FILE` runs the perplexity task over
your own .jsonl ({"text": ...} per line) or .txt (one document); `--include-path DIR` adds your own task YAMLs (their
data_files must be absolute or local to the working directory). A task folder is code: lm-eval imports the .py files
its YAMLs name with `!function`, so give only a folder you trust; a task, group or tag in it named like one lm-eval
ships (arc_easy...) or one shipped here is refused, naming it (lm-eval would let it replace the known task). A
checkpoint is exported to a temporary directory with `recipes.hf.export` first. Scores go to stdout, to --out as JSON,
and with --log-metrics / --tensorboard into a training run's metrics.jsonl (one record: step + eval/<task>/<metric>)
and TensorBoard, where the report plots them.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

from recipes.config.loading import RecipeError
from recipes.config.logs import setup_logging
from recipes.config.cli_help import command_parser, refuse
from recipes.tools import eval_names

log = logging.getLogger(__name__)

TASKS_DIR = Path(__file__).parent / "eval_tasks"
DEFAULT_TASKS = ("recipes_mc", "recipes_ppl")


def go_offline() -> None:
    """Before datasets / transformers / lm_eval are imported: they read these once, at import."""
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ[var] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def task_configs(names: list[str], text_file: str | None, tmp: Path) -> list:
    """lm-eval task specs: the shipped YAMLs as dicts with their data files made absolute (lm-eval would resolve a
    relative data_files path against the working directory), other names as they are (lm-eval's registry or
    --include-path)."""
    import yaml

    specs: list = []
    for name in names:
        if not _shipped(name):
            specs.append(name)
            continue
        path = TASKS_DIR / f"{name}.yaml"
        cfg = yaml.safe_load(path.read_text())
        files = cfg["dataset_kwargs"]["data_files"]
        cfg["dataset_kwargs"]["data_files"] = {k: str(TASKS_DIR / v) for k, v in files.items()}
        if name == "recipes_ppl" and text_file:
            cfg["dataset_kwargs"]["data_files"] = {"test": str(_as_jsonl(Path(text_file), tmp))}
        specs.append(cfg)
    return specs


def _shipped(name: str) -> bool:
    """A task shipped in recipes/tools/eval_tasks (handed to lm-eval as a config, not looked up in its index)."""
    return (TASKS_DIR / f"{name}.yaml").is_file()


def task_manager(include_path: str | None, names: list[str], builtin_dir: Path | None = None,
                 cache_dir: Path | None = None):
    """lm-eval's TaskManager: its own tasks, plus those of `include_path`, none of which may take a known name. With
    no folder and only tasks shipped here (`names`; they go to lm-eval as configs), an empty one: indexing lm-eval's
    ~14,700 task YAMLs costs ~9-13 s of CPU that such a run never uses.

    lm-eval lets a task of an include path replace a built-in one of the same name with only a log warning, so a
    folder could run its code under a name users trust (`arc_easy`): a folder name that lm-eval or this package ships
    is refused. When the run needs only the folder's tasks (and shipped ones), lm-eval's names come from a cache
    (recipes/tools/eval_names.py) and only the folder is indexed; otherwise the index is built with the folder
    *first* and lm-eval's own tasks after it (a later path wins): a name of the folder whose entry is then not the
    folder's own is a known name, and that index refreshes the cache. `builtin_dir` and `cache_dir` (for tests):
    lm-eval's task tree and the cache's folder."""
    from lm_eval.tasks import TaskManager

    if not include_path:
        return TaskManager(include_defaults=not all(map(_shipped, names)))
    folder = Path(include_path)
    if not folder.is_dir():
        raise FileNotFoundError(f"--include-path {include_path}: no such directory (give a folder of lm-eval task "
                                "YAMLs)")
    own_manager = TaskManager(include_path=str(folder), include_defaults=False)
    own = own_manager.task_index
    builtin_dir = builtin_dir or Path(sys.modules[TaskManager.__module__].__file__).parent  # include_defaults' tree
    if folder_suffices(own, names):
        manager, known = own_manager, eval_names.builtin_names(builtin_dir, cache_dir)
    else:
        manager = TaskManager(include_path=[str(folder), str(builtin_dir)], include_defaults=False)
        known = {name for name, entry in manager.task_index.items() if own.get(name) != entry}
        eval_names.store_names(builtin_dir, known, cache_dir)
    shipped = {p.stem for p in TASKS_DIR.glob("*.yaml")}
    for name, entry in sorted(own.items()):
        if name in shipped or name in known:
            kind = entry.kind.name.lower().removeprefix("py_")  # task, group or tag
            where = f"a task shipped in {TASKS_DIR}" if name in shipped else "a task lm-eval ships"
            raise RecipeError(f"--include-path {folder}: {kind} '{name}' ({entry.yaml_path or folder}) has the name "
                              f"of {where}; a task folder is code (lm-eval imports the .py files its YAML names with "
                              f"!function) and must not replace a known task: rename it (e.g. my_{name})")
    return manager


def folder_suffices(own: dict, names: list[str]) -> bool:
    """Whether the folder's own index runs `names`: each is shipped here or the folder's, and every member its groups
    list by name is the folder's too (a group may list lm-eval's tasks, which only the full index holds)."""
    if not all(_shipped(n) or n in own for n in names):
        return False
    return all(ref in own for entry in own.values() if entry.kind.name == "GROUP"
               for ref in _member_names((entry.cfg or {}).get("task")))


def _member_names(members):
    """The names a group's `task:` list refers to: plain names, dict members' `task`, inline groups' members."""
    for m in members if isinstance(members, list) else [members]:
        if isinstance(m, str):
            yield m
        elif isinstance(m, dict):  # an inline group lists members itself; a dict task names one (with overrides)
            if "group" not in m and isinstance(m.get("task"), str):
                yield m["task"]
            else:
                yield from _member_names(m.get("task"))
        elif m is not None:
            yield str(m)


def _as_jsonl(path: Path, tmp: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"--text {path}: no such file")
    if path.suffix in (".jsonl", ".json"):
        return path.resolve()
    out = tmp / f"{path.stem}.jsonl"  # a .txt file is one document (cutting prose at blank lines would split it)
    out.write_text(json.dumps({"text": path.read_text(encoding="utf-8", errors="replace")}) + "\n")
    return out


def scores_of(results: dict) -> dict[str, float]:
    """lm-eval's results {task: {"acc,none": x, "acc_stderr,none": s, "alias": ...}} -> {"task/acc": x}."""
    out = {}
    for task, metrics in results["results"].items():
        for key, value in metrics.items():
            metric, _, _ = key.partition(",")
            if metric.endswith("_stderr") or metric == "sample_len" or not isinstance(value, (int, float)):
                continue
            out[f"{task}/{metric}"] = float(value)
    return out


def evaluate_model(model_dir: str | Path, tasks: list[str], *, device: str = "cpu", batch_size: int = 8,
                   limit: int | None = None, text_file: str | None = None, include_path: str | None = None,
                   dtype: str = "float32") -> dict:
    """Run lm-eval's HF backend on a transformers directory; returns {"scores": {task/metric: value}, ...}."""
    go_offline()
    import torch

    try:
        from lm_eval import evaluator
    except ImportError:
        raise RecipeError("recipes evaluate needs lm-evaluation-harness: pip install 'lm-eval[hf]==0.4.13' (or "
                          "pip install -e '.[eval]')") from None
    from lm_eval.models.huggingface import HFLM

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"--model {model_dir}: no transformers model there (config.json missing); give an "
                                "export-hf output directory, or --checkpoint CKPT_DIR to export one first")
    tasks_known = task_manager(include_path, tasks)  # before the model loads: a refused folder costs no model load
    kwargs = {}
    if (model_dir / "export_info.json").is_file():
        # Our exports were trained on documents that follow an EOD (data_prep appends one, adds no BOS): score from
        # EOD, as training saw each document, rather than lm-eval's default BOS prefix.
        from transformers import AutoTokenizer

        eos = AutoTokenizer.from_pretrained(str(model_dir)).eos_token_id
        if eos is not None:
            kwargs["prefix_token_id"] = eos
    start = time.perf_counter()
    lm = HFLM(pretrained=str(model_dir), device=device, batch_size=batch_size, dtype=getattr(torch, dtype), **kwargs)
    with tempfile.TemporaryDirectory() as tmp:
        results = evaluator.simple_evaluate(
            model=lm, tasks=task_configs(tasks, text_file, Path(tmp)),
            task_manager=tasks_known,
            limit=limit, log_samples=False, bootstrap_iters=0)
    return {"model": str(model_dir), "tasks": list(tasks), "scores": scores_of(results),
            "n_samples": {t: v.get("effective", v.get("original")) for t, v in results.get("n-samples", {}).items()},
            "seconds": time.perf_counter() - start, "lm_eval_version": _version("lm_eval")}


def _version(pkg: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(pkg.replace("_", "-"))
    except PackageNotFoundError:
        return "?"


def evaluate_checkpoint(ckpt_dir: str, recipe, tasks: list[str], tag: str | None = None, **kw) -> dict:
    """Export `ckpt_dir` (any layout) to a temporary directory with recipes.hf.export, then evaluate that."""
    from recipes.hf.export import export

    with tempfile.TemporaryDirectory(prefix="recipes-eval-") as tmp:
        t0 = time.perf_counter()
        export(ckpt_dir, str(Path(tmp) / "hf"), recipe, tag=tag)
        export_s = time.perf_counter() - t0
        result = evaluate_model(Path(tmp) / "hf", tasks, **kw)
    result.update(model=str(Path(ckpt_dir).resolve()), tag=tag, export_seconds=export_s)
    return result


def log_scores(scores: dict[str, float], step: int, metrics_file: str | None, tb_dir: str | None) -> None:
    """One metrics.jsonl record (appended in one write: the training loop appends to the same file) + TensorBoard."""
    record = {"step": step, **{f"eval/{k}": v for k, v in scores.items()}}
    if metrics_file:
        Path(metrics_file).parent.mkdir(parents=True, exist_ok=True)
        with open(metrics_file, "a") as f:
            f.write(json.dumps(record) + "\n")
    if tb_dir:
        from torch.utils.tensorboard import SummaryWriter

        with SummaryWriter(tb_dir, filename_suffix=".eval") as tb:  # its own event file next to the run's
            for k, v in scores.items():
                tb.add_scalar(f"eval/{k}", v, step)


def _quiet_libraries(quiet: bool) -> None:
    """Logging as the other commands; with --quiet, lm-eval, datasets and transformers say nothing (they speak through
    logging and tqdm bars); offline: nothing is downloaded."""
    setup_logging(quiet=quiet)
    if quiet:
        os.environ["TQDM_DISABLE"] = "1"
        for name in ("lm_eval", "lm-eval", "datasets", "transformers"):
            logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=r".*(Apex|Transformer Engine).* not installed")
    go_offline()


def main(argv: list[str] | None = None) -> int:
    ap = command_parser("python -m recipes evaluate", __doc__)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="a transformers model directory (e.g. an export-hf output)")
    src.add_argument("--checkpoint", help="a training checkpoint directory: exported to a temporary directory first")
    ap.add_argument("--tag", help="checkpoint tag global_stepN (default: the `latest` file)")
    ap.add_argument("--config", help="the run's recipe (default: CHECKPOINT/recipe.yaml)")
    ap.add_argument("--tasks", default=",".join(DEFAULT_TASKS),
                    help=f"comma-separated lm-eval tasks (default {','.join(DEFAULT_TASKS)}, shipped in {TASKS_DIR})")
    ap.add_argument("--include-path", help="a directory of your own lm-eval task YAMLs; it is code (its !function "
                                           "entries import the .py beside them): only a folder you trust; names of "
                                           "known tasks are refused")
    ap.add_argument("--text", help="run recipes_ppl over this .jsonl ({\"text\": ...} lines) or .txt file instead")
    ap.add_argument("--limit", type=int, help="at most N documents per task")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                    help="weights and compute (float32: exact scores; bfloat16 halves GPU memory for big models)")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--log-metrics", help="append the scores to this metrics.jsonl (needs --step)")
    ap.add_argument("--tensorboard", help="write the scores to this TensorBoard directory (needs --step)")
    ap.add_argument("--step", type=int, help="the training step the scores belong to")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("overrides", nargs="*", help="section.key=value overrides the run used (with --checkpoint)")
    ns = ap.parse_args(argv)
    if (ns.log_metrics or ns.tensorboard) and ns.step is None:
        ap.error("--log-metrics / --tensorboard need --step N (the training step of the checkpoint)")
    _quiet_libraries(ns.quiet)
    tasks = [t.strip() for t in ns.tasks.split(",") if t.strip()]
    kw = dict(device=ns.device, batch_size=ns.batch_size, limit=ns.limit, text_file=ns.text,
              include_path=ns.include_path, dtype=ns.dtype)
    from recipes.checkpoint.format.errors import CheckpointError
    from recipes.hf.convert import UnsupportedModel

    try:
        if ns.checkpoint:
            from recipes.checkpoint.recipe_file import load_checkpoint_recipe

            recipe = load_checkpoint_recipe(ns.checkpoint, ns.config, ns.overrides)
            result = evaluate_checkpoint(ns.checkpoint, recipe, tasks, tag=ns.tag, **kw)
        else:
            result = evaluate_model(ns.model, tasks, **kw)
    except (RecipeError, CheckpointError, UnsupportedModel, FileNotFoundError, FileExistsError) as e:
        return refuse(e)
    result["step"] = ns.step
    for k, v in result["scores"].items():
        print(f"{k:<40} {v:.6g}")
    print(f"({result['seconds']:.1f} s, lm-eval {result['lm_eval_version']})")
    if ns.out:
        Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.out).write_text(json.dumps(result, indent=1))
    if ns.step is not None:
        log_scores(result["scores"], ns.step, ns.log_metrics, ns.tensorboard)
    return 0


if __name__ == "__main__":
    sys.exit(main())
