"""A resume over a checkpoint of another model shape is refused before any rank starts, naming both shapes (issue 42
item 3): complete.json records the model; before, every rank started and died after ~20 s with 118 lines of
DeepSpeed size mismatches. The tags are complete.json records as the trainer writes them
(tests/support/checkpoints.py); the launcher's dry run refuses the same (no log dir written)."""
import pytest

from recipes.config.loading import load_recipe
from recipes.planner.validation import validate_for_launch
from tests.recipes.test_validation_launch import write_manifest
from tests.support.checkpoints import recorded_tag
from tests.support.launch import REPO

pytestmark = pytest.mark.unit

TINY = "configs/runs/tiny-cpu.yaml"  # tiny: 4 layers, hidden 64, 4 heads, 2 query groups, ffn 128, vocab 320


def found(tmp_path, ckpt, *overrides, world=1):
    data = write_manifest(tmp_path / "data")
    recipe = load_recipe(TINY, [f"data.manifests=[{data}]", f"checkpoint.dir={ckpt}", *overrides])
    return validate_for_launch(recipe, world)


def test_a_resume_over_another_model_is_refused_naming_both_shapes(tmp_path):
    ck = tmp_path / "ck"
    recorded_tag(ck, TINY)
    assert found(tmp_path, ck) == []  # the same model resumes
    [p] = found(tmp_path, ck, "model.num_layers=3", "model.ffn_hidden_size=256")
    assert p.field == "model.num_layers"
    assert str(p) == (f"checkpoint.dir = {ck} holds global_step4 of another model (model.num_layers=4, "
                      "model.ffn_hidden_size=128); this recipe has model.num_layers=3, model.ffn_hidden_size=256: its "
                      "weights do not fit this model; resume with the checkpoint's model (set model.num_layers=4, "
                      "model.ffn_hidden_size=128), or train this model in a new checkpoint.dir "
                      "(checkpoint.init_from cannot change a model's shape either)")


def test_a_vocabulary_change_is_named_as_the_model_not_as_a_reshape(tmp_path):
    """A vocabulary of another size pads differently too: the layout check alone would send the user to `recipes
    reshape`, which cannot change a model's shape."""
    ck = tmp_path / "ck"
    recorded_tag(ck, TINY)
    [p] = found(tmp_path, ck, "model.vocab_size=640")
    assert p.message.startswith(f"checkpoint.dir = {ck} holds global_step4 of another model (model.vocab_size=320)")
    assert "reshape" not in str(p)


def test_no_record_or_no_resume_is_left_to_the_load(tmp_path):
    ck = tmp_path / "ck"
    recorded_tag(ck, TINY)
    assert found(tmp_path, ck, "model.num_layers=3", "checkpoint.auto_resume=false") == []
    assert found(tmp_path, tmp_path / "empty", "model.num_layers=3") == []


def test_the_launcher_refuses_it_in_the_dry_run(tmp_path, launch_here):
    ck = tmp_path / "ck"
    recorded_tag(ck, TINY, world=2)
    data = write_manifest(tmp_path / "data")
    logs = tmp_path / "logs"
    r = launch_here("train.sh", REPO / TINY, "--backend", "local", "--num-gpus", "2", "--dry-run", "--log-dir", logs,
                    "--", f"data.manifests=[{data}]", f"checkpoint.dir={ck}", "model.hidden_size=128")
    assert r.returncode == 2 and not logs.exists()
    assert r.stderr.startswith(f"[launch] error: recipe 'tiny-cpu' cannot start:\n  - checkpoint.dir = {ck} holds "
                               "global_step4 of another model (model.hidden_size=64); this recipe has "
                               "model.hidden_size=128")
