"""Curation (curate, tokenize --steps) refuses a URL output up front: the passes exchange buckets through the output
directory with renames. Refused before the tokenizer is loaded, the output probed or a Slurm script rendered (unit)."""
import pytest
from tests.support.data_prep import run_cli, write_jsonl

from data_prep import curate, pipeline
from data_prep.curate import CurateSettings
from data_prep.settings import Settings

pytestmark = pytest.mark.unit

POSIX = "the curation passes need a POSIX output directory"


@pytest.fixture
def inputs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a URL taken for a relative path would show up here as ./s3:/...
    write_jsonl(tmp_path / "a.jsonl", [{"text": "hello world"}] * 2)
    (tmp_path / "s.yaml").write_text("steps:\n  - exact_dedup: {}\n")
    return tmp_path


def _nothing_written(d):
    return sorted(p.name for p in d.iterdir()) == ["a.jsonl", "s.yaml"]


def test_curate_settings_run_and_incomplete_slices_refuse_a_url_output(inputs):
    with pytest.raises(ValueError, match=f"curate with the output s3://b/cur: {POSIX}"):
        CurateSettings(inputs=["a.jsonl"], output_dir="s3://b/cur", steps="s.yaml")
    s = CurateSettings(inputs=["a.jsonl"], output_dir="cur", steps="s.yaml", quiet=True)
    s.output_dir = "s3://b/cur"  # changed after construction: run and incomplete_slices check again
    with pytest.raises(ValueError, match=POSIX):
        curate.run(s)
    with pytest.raises(ValueError, match=POSIX):
        curate.incomplete_slices(s, 4)
    with pytest.raises(ValueError, match=POSIX):
        curate.context("s3://b/cur", None, [], "text", 1, 1)
    assert _nothing_written(inputs)


def test_tokenize_steps_refuses_a_url_output_before_loading_the_tokenizer(inputs):
    with pytest.raises(ValueError, match=f"--steps with the output s3://b/t: {POSIX}"):
        Settings(inputs=["a.jsonl"], output_dir="s3://b/t", tokenizer="missing.model", steps="s.yaml")
    s = Settings(inputs=["a.jsonl"], output_dir="t", tokenizer="missing.model", steps="s.yaml", quiet=True)
    s.output_dir = "s3://b/t"
    # the tokenizer does not exist: a TokenizerError here would mean it was loaded (and the output probed) first
    with pytest.raises(ValueError, match=POSIX):
        pipeline.run(s)
    with pytest.raises(ValueError, match=POSIX):
        pipeline.incomplete_slices(s, 4)
    assert _nothing_written(inputs)
    # without --steps a URL output is fine (shards are staged and uploaded)
    Settings(inputs=["a.jsonl"], output_dir="s3://b/t", tokenizer="missing.model")


@pytest.mark.parametrize("command", [["curate"], ["tokenize", "-t", "missing.model"]])
def test_cli_curate_and_slurm_refuse_a_url_output_and_render_nothing(inputs, command):
    common = [inputs / "a.jsonl", "--steps", inputs / "s.yaml", "-o", "s3://b/out"]
    r = run_cli(*command, *common, check=False)
    assert r.returncode == 2 and POSIX in r.stderr, r.stderr
    r = run_cli("slurm", "--tasks", 2, "--dry-run", "--scripts-dir", inputs / "scripts", "--", *command, *common,
                check=False)
    assert r.returncode == 2 and POSIX in r.stderr, r.stderr
    assert "#SBATCH" not in r.stdout and _nothing_written(inputs)
