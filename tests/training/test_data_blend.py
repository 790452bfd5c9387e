"""Training reads a `data_prep blend` file (weighted sources) as well as plain manifests: the weights, prefixes and
tokenizer that reach megatron-core's dataset builder are the blend's."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from recipes.train.data import DataError, load_blend
from recipes.config.loading import load_recipe

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def _corpus(path: Path, word: str, docs: int) -> Path:
    lines = [json.dumps({"text": f"{word} number {i} says {word * (i % 5 + 1)} and more {i * 7}"}) for i in range(docs)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def two_sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("blend")
    web = _corpus(root / "web.jsonl", "web", 300)
    code = _corpus(root / "code.jsonl", "code", 100)
    def data_prep(*args):
        res = subprocess.run([sys.executable, "-m", "data_prep", *map(str, args)], cwd=REPO, text=True,
                             capture_output=True)
        assert res.returncode == 0, f"data_prep {args[0]} failed:\n{res.stdout}\n{res.stderr}"

    data_prep("train-tokenizer", web, code, "-o", root / "sp", "--vocab-size", "320", "-q")
    for name, src in (("web", web), ("code", code)):
        data_prep("tokenize", src, "-o", root / name, "-t", root / "sp.model", "-q")
    data_prep("blend", f"web={root / 'web'}:0.7", f"code={root / 'code'}:0.3", "-o", root / "blend.json")
    return root


def _recipe(*overrides):
    return load_recipe(REPO / "configs" / "runs" / "tiny-cpu.yaml", list(overrides))


def test_blend_file_weights_prefixes_and_tokenizer(two_sources):
    root = two_sources
    blend = load_blend(_recipe(f"data.manifests=[{root / 'blend.json'}]"))
    by_source = {"web": 0.0, "code": 0.0}
    for w, p in zip(blend.weights, blend.prefixes):
        assert Path(p + ".bin").is_file() and Path(p + ".idx").is_file()
        by_source[Path(p).parent.name] += w
    assert by_source["web"] == pytest.approx(0.7) and by_source["code"] == pytest.approx(0.3)
    web_manifest = json.loads((root / "web" / "manifest.json").read_text())
    assert blend.tokenizer.vocab_size == web_manifest["tokenizer"]["vocab_size"]
    assert blend.tokenizer.eod == web_manifest["tokenizer"]["eod_id"]


def test_plain_manifests_weigh_by_tokens(two_sources):
    root = two_sources
    blend = load_blend(_recipe(f"data.manifests=[{root / 'web'},{root / 'code'}]"))
    tokens = {n: json.loads((root / n / "manifest.json").read_text())["totals"]["tokens"] for n in ("web", "code")}
    got = {n: sum(w for w, p in zip(blend.weights, blend.prefixes) if Path(p).parent.name == n) for n in tokens}
    assert got == {n: pytest.approx(t) for n, t in tokens.items()}


def test_missing_manifest_is_named(tmp_path):
    with pytest.raises(DataError, match="has no manifest.json"):
        load_blend(_recipe(f"data.manifests=[{tmp_path / 'nowhere'}]"))
