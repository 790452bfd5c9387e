"""docs/moe.md's tiny DeepSeek-V3 example runs as written, in order: data, a random transformers DeepSeek-V3, import
at TP2 x PP2 x EP2, 6 steps of continued pretraining on 8 ranks, export, generation with transformers. Run from a
directory that shows the repository's code, configs and .venv where the repository root does, so the outputs land in
tmp_path (the docs' commands are checked for stale names and flags by tests/test_docs_commands.py)."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.support import doc_commands as dc
from tests.support import rank_forks

pytestmark = pytest.mark.multiproc

DOC = dc.REPO / "docs" / "moe.md"
HEADING = "### A tiny DeepSeek-V3 on CPU"


def example_lines() -> list[tuple[str, str]]:
    """(file:line, command) of the first command block after the example's heading, in order."""
    lines = DOC.read_text().splitlines()
    start = next(i for i, line in enumerate(lines, 1) if line.startswith(HEADING))
    end = next(i for i, line in enumerate(lines, 1) if i > start and line.startswith(("## ", "### ")))
    seen: dict[str, str] = {}
    for c in dc.block_commands(DOC):
        if start < int(c.where.rsplit(":", 1)[1]) < end:
            seen.setdefault(c.where, c.text)
    return list(seen.items())


def test_the_deepseek_example_runs_as_written(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    for name in ("configs", "recipes", "data_prep"):
        (root / name).symlink_to(dc.REPO / name)
    (root / ".venv").symlink_to(rank_forks.venv())  # each `-m recipes|data_prep` forked from a pre-imported template
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(root))
    lines = example_lines()
    assert len(lines) == 6, lines
    out = ""
    for where, text in lines:
        r = subprocess.run(["bash", "-c", text], cwd=root, env=env, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"{where}: `{text}` exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
        assert "Traceback" not in r.stderr, f"{where}: `{text}`\n{r.stderr[-4000:]}"
        out = r.stdout
    assert out.startswith("def main("), out  # the prompt, then the model's greedy continuation
    records = [json.loads(x) for x in (root / "out/ds-v3/logs/metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, 7)) and "moe_expert_bias" in steps[-1]
    config = json.loads((root / "out/ds-v3-trained-hf/config.json").read_text())
    assert config["architectures"] == ["DeepseekV3ForCausalLM"] and config["n_group"] == 4
    recipe = (root / "out/ds-v3/recipe.yaml").read_text()
    assert "ep: 2" in recipe and "tp: 2" in recipe and "pp: 2" in recipe
