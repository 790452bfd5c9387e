"""Data-only loading is a property of every process of the project, not of each call site (round 4 of the security
read: DeepSpeed's default checkpoint engine unpickled an MoE checkpoint's files in export-hf's ranks):

- torch.load is replaced as soon as torch is imported, whichever of torch and the project comes first, and a caller
  asking for weights_only=False (DeepSpeed's TorchCheckpointEngine) gets data or a refusal naming the file;
- nothing in the product reads a pickle any other way (a scan of recipes/, data_prep/ and launch/)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _payload(path: Path, marker: Path) -> None:
    code = ("import torch\nclass P:\n    def __reduce__(self): return (open, (%r, 'w'))\n"
            "torch.save({'x': torch.zeros(2), 'p': P()}, %r)\n" % (str(marker), str(path)))
    subprocess.run([sys.executable, "-c", code], check=True, cwd="/")  # without the project: a plain torch.save


@pytest.mark.multiproc  # fresh interpreters importing torch and DeepSpeed: ~4 s each
@pytest.mark.parametrize("first,load", [
    ("import recipes, torch", "from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import "
                              "TorchCheckpointEngine\nTorchCheckpointEngine().load(PATH)"),
    ("import torch, recipes", "torch.serialization.load(PATH, weights_only=False)"),
    # the safe loader's own module importing torch first (it once failed as a circular import in `recipes reshape`)
    ("import recipes.checkpoint.safe_load, torch", "torch.load(PATH, weights_only=False)"),
], ids=["project first, DeepSpeed's engine", "torch first, torch.serialization.load", "the loader imports torch"])
def test_torch_load_of_a_project_process_never_unpickles_code(tmp_path, first, load):
    bad, marker = tmp_path / "bad.pt", tmp_path / "pwned"
    _payload(bad, marker)
    code = f"{first}\n" + load.replace("PATH", repr(str(bad)))
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and not marker.exists(), r.stderr[-2000:]
    assert f"UnsafeCheckpointError: {bad}: refused to load: the file asks to build" in r.stderr, r.stderr[-2000:]


def _unsafe_calls(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value.id if isinstance(node.func.value, ast.Name) else getattr(node.func.value, "attr", "")
        name = f"{owner}.{node.func.attr}"
        pickles = any(k.arg == "allow_pickle" and not (isinstance(k.value, ast.Constant) and k.value.value is False)
                      for k in node.keywords)
        if name in ("torch.load", "serialization.load", "pickle.load", "pickle.loads", "dill.load") or \
                (name in ("np.load", "numpy.load") and pickles):
            found.append(f"{path}:{node.lineno}: {name}")
    return found


@pytest.mark.unit
def test_no_product_code_reads_a_pickle_but_through_the_guard(tmp_path):
    allowed = {REPO / "recipes" / "checkpoint" / "safe_load.py"}  # the guard itself calls torch's own loader
    found = [hit for pkg in ("recipes", "data_prep", "launch") for p in sorted((REPO / pkg).rglob("*.py"))
             if p not in allowed for hit in _unsafe_calls(p)]
    assert found == [], found
    planted = tmp_path / "planted.py"  # the scan finds such a call where there is one
    planted.write_text("import numpy as np, torch\nx = torch.load('f.pt', weights_only=False)\n"
                       "y = np.load('f.npy', allow_pickle=True)\nz = np.load('f.npy', allow_pickle=False)\n")
    assert _unsafe_calls(planted) == [f"{planted}:2: torch.load", f"{planted}:3: np.load"]
