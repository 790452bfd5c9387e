"""The shipped lm-eval tasks load offline through lm-eval's own task builder from any working directory (data files
made absolute), `--text` swaps the perplexity text, and the report reads stage labels and eval records from a
metrics.jsonl (synthetic records here; the training tests write real ones)."""
from __future__ import annotations

import json

import pytest

from recipes.tools.evaluate import TASKS_DIR, scores_of, task_configs, task_manager
from recipes.tools.report import read_evals, stage_starts, write_report




@pytest.mark.multiproc  # not the fast tier: lm-eval and datasets imported, two datasets built
def test_shipped_tasks_build_offline_from_another_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative data_files would resolve here and fail
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")  # what go_offline sets, undone after the test
    from lm_eval.tasks import get_task_dict

    names = ["recipes_mc", "recipes_ppl"]
    manager = task_manager(None, names)
    assert manager.task_index == {}  # shipped tasks only: lm-eval's ~14,700 task YAMLs are not indexed (~9 s of CPU)
    tasks = get_task_dict(task_configs(names, None, tmp_path), manager)
    mc, ppl = tasks["recipes_mc"], tasks["recipes_ppl"]
    docs = list(mc.test_docs())
    assert len(docs) == 20
    answers = [mc.doc_to_target(d) for d in docs]
    assert sorted(set(answers)) == [0, 1, 2, 3]  # the right continuation sits in every position
    assert all(mc.doc_to_choice(d) == d["choices"] for d in docs)
    texts = [json.loads(x)["text"] for x in (TASKS_DIR / "recipes_ppl.jsonl").read_text().splitlines()]
    assert [ppl.doc_to_target(d) for d in ppl.test_docs()] == texts


@pytest.mark.unit
def test_text_file_replaces_the_perplexity_text(tmp_path):
    txt = tmp_path / "mine.txt"
    txt.write_text("first line\n\nsecond paragraph\n")
    (cfg,) = task_configs(["recipes_ppl"], str(txt), tmp_path)
    (path,) = cfg["dataset_kwargs"]["data_files"].values()
    assert [json.loads(x) for x in open(path)] == [{"text": "first line\n\nsecond paragraph\n"}]  # one document
    with pytest.raises(FileNotFoundError, match="--text"):
        task_configs(["recipes_ppl"], str(tmp_path / "missing.txt"), tmp_path)


@pytest.mark.unit
def test_scores_of_keeps_metrics_drops_stderr():
    res = {"results": {"recipes_mc": {"alias": "recipes_mc", "acc,none": 0.5, "acc_stderr,none": "N/A",
                                      "sample_len,none": 20},
                       "recipes_ppl": {"bits_per_byte,none": 3.5, "bits_per_byte_stderr,none": 0.1}}}
    assert scores_of(res) == {"recipes_mc/acc": 0.5, "recipes_ppl/bits_per_byte": 3.5}


@pytest.mark.unit
def test_report_shows_stage_boundaries_and_scores(tmp_path):
    recs = [{"step": s, "loss": 5.0 - s / 10, "lr": 1e-3, "tokens_per_s": 100.0, "tflops_per_gpu": 1e-3, "mfu": 0.01,
             "step_time_s": 0.1, "stage": "main" if s <= 4 else "anneal"} for s in range(1, 7)]
    recs.insert(3, {"step": 3, "eval/recipes_mc/acc": 0.25, "eval/recipes_ppl/bits_per_byte": 4.0})
    recs.append({"step": 6, "eval/recipes_mc/acc": 0.5, "eval/recipes_ppl/bits_per_byte": 3.0})
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert stage_starts([r for r in recs if "loss" in r]) == [(5, "anneal")]
    assert [r["step"] for r in read_evals(metrics)] == [3, 6]
    report = write_report(tmp_path / "out", metrics=metrics).read_text()
    assert "- data stages: main from step 1, anneal from step 5" in report
    assert "| step | recipes_mc/acc | recipes_ppl/bits_per_byte |" in report and "| 6 | 0.5 | 3 |" in report
    assert (tmp_path / "out" / "evals.png").is_file()


@pytest.mark.unit
def test_training_hook_command_and_refusal(tmp_path):
    from recipes.config.loading import RecipeError, load_recipe
    from recipes.train.cli import validate_recipe
    from recipes.train.evaluation import BackgroundEval
    from recipes.train.policy import SaveEvalStopPolicy

    recipe_path = TASKS_DIR.parents[2] / "configs" / "runs" / "tiny-cpu.yaml"
    r = load_recipe(recipe_path, ["evaluation.interval=4", "evaluation.limit=5", f"checkpoint.dir={tmp_path}"])
    ev = BackgroundEval(r, str(tmp_path), tmp_path / "logs", enabled=True)
    policy = SaveEvalStopPolicy(10, r.checkpoint.save_interval, r.evaluation.interval, checkpointing=True)
    assert [s for s in range(1, 11) if policy.eval_due(s)] == [4, 8, 10]  # every 4 steps and the last
    cmd = ev.command(8)
    assert cmd[1:4] == ["-m", "recipes", "evaluate"]
    for flag, value in (("--tag", "global_step8"), ("--step", "8"), ("--limit", "5"),
                        ("--log-metrics", str(tmp_path / "logs" / "metrics.jsonl")),
                        ("--tasks", "recipes_mc,recipes_ppl"), ("--device", "cpu")):
        assert cmd[cmd.index(flag) + 1] == value
    with pytest.raises(RecipeError, match="evaluation.interval = 4 .* checkpoint.dir is not set"):
        validate_recipe(load_recipe(recipe_path, ["evaluation.interval=4"]), 1, show_warnings=False)
