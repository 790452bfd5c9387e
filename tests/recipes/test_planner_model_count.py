"""The planner's exact parameter count equals the model recipes.model instantiates (megatron-core layers), in total
per rank at TP=2 (and so in total), for a Llama-shaped and a GPT-shaped tiny preset."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from recipes.loading import load_recipe
from recipes.planner import count_parameters, params_per_gpu

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("planner_model_count_worker.py")
PRESETS = ["tiny", "tiny-gpt"]  # rope/rmsnorm/swiglu/GQA/untied and learned/layernorm/gelu/bias/tied


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _instantiated_counts(tp: int) -> list[dict]:
    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore")
    procs = [subprocess.Popen([sys.executable, str(WORKER), port, str(r), str(tp), str(tp), *PRESETS], cwd=REPO,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(tp)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1])["counts"])
    return results


def _model(name):
    return load_recipe(f"models/{name}", ["training.global_batch=8"]).model


@pytest.mark.timeout(240)
def test_count_equals_instantiated_model():
    # TP=2 in two gloo processes: each rank holds exactly params_per_gpu(tp=2) (split matrices + replicated norms
    # and row-parallel biases), and the total at TP=1 is the exact count.
    ranks = _instantiated_counts(2)
    for name in PRESETS:
        model = _model(name)
        for counts in ranks:
            assert counts[name] == params_per_gpu(model, 2, 1), name
        assert params_per_gpu(model, 1, 1) == count_parameters(model, tp=1)
