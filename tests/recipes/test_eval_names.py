"""`recipes evaluate --include-path`: lm-eval's own names come from a cache keyed by its task files, and a folder task
that takes one of them is refused whether the cache is cold, warm or stale; a folder whose groups list lm-eval's tasks
gets the full index. Here lm-eval's task tree is a small stand-in folder, indexed by lm-eval's real TaskManager
(tests/recipes/test_eval_include_trust.py runs the same refusal end to end on lm-eval's ~14,700 task YAMLs)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from recipes.config.loading import RecipeError
from recipes.tools import eval_names
from recipes.tools.evaluate import folder_suffices, task_manager

pytestmark = pytest.mark.unit


def builtin_tree(root: Path) -> Path:
    """A stand-in for lm-eval's task tree: a task, a tagged task and a group, in subfolders as lm-eval keeps them."""
    (root / "arc").mkdir(parents=True)
    (root / "arc" / "fake_arc.yaml").write_text("task: fake_arc\ntag: fake_suite\n")
    (root / "arc" / "fake_arc_group.yaml").write_text("group: fake_arc_group\ntask: [fake_arc]\n")
    (root / "misc").mkdir()
    (root / "misc" / "fake_misc.yaml").write_text("task: fake_misc\n")
    return root


def folder(root: Path, **yamls: str) -> Path:
    root.mkdir(parents=True)
    for name, text in yamls.items():
        (root / f"{name}.yaml").write_text(text)
    return root


def test_names_are_indexed_once_then_read_from_the_cache_until_the_tree_changes(tmp_path):
    tree, cache = builtin_tree(tmp_path / "tasks"), tmp_path / "cache"
    names = {"fake_arc", "fake_suite", "fake_arc_group", "fake_misc"}
    assert eval_names.builtin_names(tree, cache) == names  # cold: indexed by lm-eval
    (cached,) = cache.glob("lm_eval_names-*.json")
    data = json.loads(cached.read_text())
    assert set(data["names"]) == names and data["key"] == eval_names.tree_key(tree)
    cached.write_text(json.dumps({**data, "names": [*data["names"], "planted"]}))
    assert "planted" in eval_names.builtin_names(tree, cache)  # warm: the file is what is read
    new = tree / "misc" / "fake_new.yaml"
    new.write_text("task: fake_new\n")  # an upgrade adds a task: a new key, indexed again
    assert eval_names.builtin_names(tree, cache) == names | {"fake_new"}
    os.utime(new, ns=(1, 1))  # an edit in place moves the mtime
    assert eval_names.cached_names(tree, cache) is None
    for bad in ("{", "[]", json.dumps({"key": "other", "names": []})):  # unreadable or someone else's: rebuilt
        for f in cache.glob("lm_eval_names-*.json"):
            f.write_text(bad)
        assert eval_names.builtin_names(tree, cache) == names | {"fake_new"}


def test_a_folder_name_lm_eval_ships_is_refused_with_a_cold_or_warm_cache(tmp_path):
    tree, cache = builtin_tree(tmp_path / "tasks"), tmp_path / "cache"
    for kind, yaml in (("task", "task: fake_misc\n"), ("tag", "task: mine2\ntag: fake_suite\n"),
                       ("group", "group: fake_arc_group\ntask: [mine]\n")):
        bad = folder(tmp_path / kind, mine="task: mine\n", shadow=yaml)
        for attempt in ("cold", "warm"):
            with pytest.raises(RecipeError, match=f"{kind} '(fake_misc|fake_suite|fake_arc_group)' .* has the name "
                                                  "of a task lm-eval ships"):
                task_manager(str(bad), ["mine"], tree, cache)
            assert list(cache.glob("lm_eval_names-*.json")), attempt
    shipped = folder(tmp_path / "shipped", recipes_mc="task: recipes_mc\n")
    with pytest.raises(RecipeError, match="task 'recipes_mc' .* has the name of a task shipped in"):
        task_manager(str(shipped), ["recipes_mc"], tree, cache)


def test_a_folder_run_indexes_lm_eval_only_when_it_needs_lm_evals_tasks(tmp_path):
    tree, cache = builtin_tree(tmp_path / "tasks"), tmp_path / "cache"
    own = folder(tmp_path / "own", mine="task: mine\n", mine_group="group: mine_group\ntask: [mine]\n")
    manager = task_manager(str(own), ["mine_group", "recipes_ppl"], tree, cache)
    assert set(manager.task_index) == {"mine", "mine_group"}  # the folder alone: lm-eval's names came from the cache
    mixed = folder(tmp_path / "mixed", mine="task: mine\n", both="group: both\ntask: [mine, {task: fake_arc}]\n")
    for names in (["both"], ["mine", "fake_misc"]):  # a group or the command line asks for lm-eval's tasks
        manager = task_manager(str(mixed), names, tree, cache)
        assert {"fake_arc", "fake_misc", "mine", "both"} <= set(manager.task_index), names
    assert set(json.loads(next(cache.glob("*.json")).read_text())["names"]) == {
        "fake_arc", "fake_suite", "fake_arc_group", "fake_misc"}  # the full index refreshed the cache


def test_folder_suffices_follows_group_members_into_inline_groups():
    from lm_eval.tasks._index import Entry, Kind

    def group(name, members):
        return Entry(name=name, kind=Kind.GROUP, yaml_path=None, cfg={"group": name, "task": members})

    own = {"a": Entry("a", Kind.TASK, None), "b": Entry("b", Kind.TASK, None)}
    assert folder_suffices({**own, "g": group("g", ["a", {"task": "b", "num_fewshot": 2}])}, ["g"])
    assert folder_suffices({**own, "g": group("g", [{"group": "inner", "task": ["a", "b"]}])}, ["g", "recipes_mc"])
    assert not folder_suffices({**own, "g": group("g", [{"group": "inner", "task": ["a", "arc_easy"]}])}, ["g"])
    assert not folder_suffices({**own, "g": group("g", "mmlu_*")}, ["a"])  # a pattern: the full index resolves it
    assert not folder_suffices(own, ["a", "hellaswag"])
