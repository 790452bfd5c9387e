"""A task folder is code (issue 25, item 2): lm-eval imports the .py files its task YAMLs name with `!function`.
`evaluation.include_path` is refused from a recipe inside a checkpoint directory (the docs send `--config` there, and
whoever prepared the directory wrote that file) and taken from the user's own recipe or the command line; a folder
task named like a known one is refused before any of its code runs, naming the task and the file."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from recipes.config.loading import RecipeError, load_recipe
from recipes.train.evaluation import check_include_path_origin
from tests.support.runs import recipes_cli

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "runs" / "tiny-cpu.yaml"


def checkpoint_dir(tmp_path: Path, include_path: str) -> Path:
    """What a checkpoint directory holds: `latest`, a global_stepN directory, and the run's resolved recipe.yaml
    (written as recipes.checkpoint.recipe_file writes it), here with an evaluation folder in it."""
    ckpt = tmp_path / "ckpt"
    (ckpt / "global_step2").mkdir(parents=True)
    (ckpt / "latest").write_text("global_step2")
    recipe = load_recipe(TINY, [f"checkpoint.dir={ckpt}", "evaluation.interval=1",
                                f"evaluation.include_path={include_path}"])
    (ckpt / "recipe.yaml").write_text(yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False))
    return ckpt


@pytest.mark.unit
def test_train_refuses_an_include_path_from_a_checkpoint_recipe_before_any_rank_starts(tmp_path):
    ckpt = checkpoint_dir(tmp_path, str(tmp_path / "planted_tasks"))
    r = subprocess.run([sys.executable, "-m", "recipes", "train", "--config", str(ckpt / "recipe.yaml"), "--local",
                        "1"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"evaluation.include_path = {tmp_path / 'planted_tasks'} comes from {ckpt / 'recipe.yaml'}" in r.stderr
    assert f"pass evaluation.include_path={tmp_path / 'planted_tasks'} as an override" in r.stderr
    assert "Traceback" not in r.stderr and not (ckpt / "logs").exists()  # nothing started


@pytest.mark.unit
def test_include_path_is_taken_from_the_command_line_or_the_users_own_recipe(tmp_path):
    ckpt = checkpoint_dir(tmp_path, "/planted")
    check_include_path_origin(str(ckpt / "recipe.yaml"), ["evaluation.include_path=/mine"], "/mine")
    check_include_path_origin(str(ckpt / "recipe.yaml"), ["evaluation.include_path=null"], None)
    mine = tmp_path / "mine.yaml"
    mine.write_text(f"extends: {TINY}\nevaluation: {{include_path: /mine}}\n")
    check_include_path_origin(str(mine), [], "/mine")
    # a recipe of mine that extends the checkpoint's: its value is the checkpoint's unless mine sets one
    over = tmp_path / "over.yaml"
    over.write_text(f"extends: {ckpt / 'recipe.yaml'}\nevaluation: {{include_path: /mine}}\n")
    check_include_path_origin(str(over), [], "/mine")
    inherits = tmp_path / "inherits.yaml"
    inherits.write_text(f"extends: [{TINY}, {ckpt / 'recipe.yaml'}]\ntraining: {{train_steps: 3}}\n")
    assert load_recipe(inherits).evaluation.include_path == "/planted"
    with pytest.raises(RecipeError, match=f"comes from {ckpt / 'recipe.yaml'}, a recipe inside a checkpoint"):
        check_include_path_origin(str(inherits), [], "/planted")


@pytest.mark.unit
def test_an_include_path_chosen_inside_a_checkpoint_dir_is_refused_through_extends_and_symlinks(tmp_path):
    """Two ways round the plain rule (round 4 of the security read): the checkpoint's recipe extends a file in a
    sub-folder of the checkpoint directory that sets the folder, or recipe.yaml is a symlink to a file elsewhere that
    sets it. Both reach lm-eval's import of the folder's code unless refused."""
    ckpt = checkpoint_dir(tmp_path, "/planted")
    (ckpt / "recipe.yaml").unlink()
    (ckpt / "sub").mkdir()
    base = ckpt / "sub" / "base.yaml"
    base.write_text(f"extends: {TINY}\nevaluation: {{include_path: /planted}}\n")
    (ckpt / "recipe.yaml").write_text("extends: sub/base.yaml\ntraining: {train_steps: 3}\n")
    assert load_recipe(ckpt / "recipe.yaml").evaluation.include_path == "/planted"
    with pytest.raises(RecipeError, match=f"comes from {base}, a recipe inside a checkpoint directory"):
        check_include_path_origin(str(ckpt / "recipe.yaml"), [], "/planted")

    elsewhere = tmp_path / "elsewhere.yaml"
    elsewhere.write_text(f"extends: {TINY}\nevaluation: {{include_path: /planted}}\n")
    (ckpt / "recipe.yaml").unlink()
    (ckpt / "recipe.yaml").symlink_to(elsewhere)
    with pytest.raises(RecipeError, match=f"comes from {ckpt / 'recipe.yaml'}, a recipe inside a checkpoint"):
        check_include_path_origin(str(ckpt / "recipe.yaml"), [], "/planted")
    # a recipe of mine extending the checkpoint's, which extends a file that sets it: still the checkpoint's choice
    mine = tmp_path / "mine.yaml"
    mine.write_text(f"extends: {ckpt / 'sub' / 'base.yaml'}\n")
    with pytest.raises(RecipeError, match="a recipe inside a checkpoint directory"):
        check_include_path_origin(str(mine), [], "/planted")
    check_include_path_origin(str(elsewhere), [], "/planted")  # the file itself, outside: the user's own


def tiny_model(out: Path, texts: list[str]) -> Path:
    """A randomly initialised 2-layer GPT-2 with a byte-level BPE tokenizer: enough for lm-eval's HF backend."""
    from tokenizers import pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    from tests.support.data_prep import train_byte_level_bpe

    out.mkdir(parents=True)
    tok_file = train_byte_level_bpe(texts, out, pre_tokenizers.ByteLevel(add_prefix_space=False), 300,
                                    "<|endoftext|>")
    tok = PreTrainedTokenizerFast(tokenizer_file=tok_file, eos_token="<|endoftext|>")
    tok.save_pretrained(str(out))
    config = GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=2, n_head=2,
                        eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
    GPT2LMHeadModel(config).save_pretrained(str(out))
    return out


def task_folder(folder: Path, name: str, marker: Path) -> Path:
    """An lm-eval task folder whose `!function` imports utils.py, which writes `marker` when imported."""
    folder.mkdir(parents=True)
    (folder / "docs.jsonl").write_text(json.dumps({"question": "1 + 1 =", "choices": [" 2", " 3"], "answer": 0}) + "\n")
    (folder / "utils.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n\n"
                                     "def process_docs(dataset):\n    return dataset\n")
    (folder / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {folder / 'docs.jsonl'}\n"
        "test_split: test\noutput_type: multiple_choice\nprocess_docs: !function utils.process_docs\n"
        "doc_to_text: '{{question}}'\ndoc_to_choice: '{{choices}}'\ndoc_to_target: '{{answer}}'\n"
        "metric_list:\n  - metric: acc\n")
    return folder


@pytest.mark.multiproc
def test_a_folder_task_named_like_a_builtin_is_refused_before_its_code_runs(tmp_path):
    model = tiny_model(tmp_path / "model", ["def f(x):\n    return x + 1\n", "1 + 1 = 2\n"] * 20)
    marker = tmp_path / "payload_ran"

    cache = tmp_path / "cache"  # lm-eval's names: indexed by the first call, read by the next

    def evaluate(folder: Path, task: str):
        return recipes_cli(["evaluate", "--model", str(model), "--include-path", str(folder), "--tasks", task,
                            "--limit", "1", "--batch-size", "1"], env=dict(os.environ, XDG_CACHE_HOME=str(cache)),
                           timeout=900)

    shadow = task_folder(tmp_path / "shadow", "arc_easy", marker)
    r = evaluate(shadow, "arc_easy")
    assert r.returncode == 2, r.stderr[-3000:]
    assert f"--include-path {shadow}: task 'arc_easy' ({shadow / 'arc_easy.yaml'}) has the name of a task " \
           "lm-eval ships" in r.stderr, r.stderr[-3000:]
    assert not marker.exists()  # refused before lm-eval imported the folder's code
    (cached,) = (cache / "recipes").glob("lm_eval_names-*.json")  # (a warm cache refuses too: test_eval_names.py)
    assert "arc_easy" in json.loads(cached.read_text())["names"]
    # the same folder under its own name runs, and its code with it: the refusal above is about the name
    own = task_folder(tmp_path / "own", "my_arc_easy", marker)
    r = evaluate(own, "my_arc_easy")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "my_arc_easy/acc" in r.stdout and marker.read_text() == "ran"
