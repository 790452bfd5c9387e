"""Logs of a batch job (issue 26, item 4): launched by launch/train.sh (the local back end: a real torchrun of two
ranks training the tiny recipe), rank 0's output goes to log files, not a terminal. There must be no progress bar
(no carriage return anywhere) and exactly one Megatron-style line per training.log_interval, whose figures are the
ones metrics.jsonl records for that step."""
from __future__ import annotations

import re

import pytest

from recipes.train.metrics import IntervalLines, interval_line, progress, ProgressBar
from tests.support.launch import free_port, launch_env, run_launch
from tests.support.runs import RECIPE, metrics

STEPS, INTERVAL = 6, 2
LINE = re.compile(r"iteration +(\d+)/ +(\d+) \| consumed samples: +(\d+) \| .*\| learning rate: (\S+) \| "
                  r"lm loss: (\S+) \| grad norm: (\S+) \| tokens/s: \S+ \| TFLOP/s/GPU: \S+ \| MFU: \S+% \| "
                  r"mem: \S+ GB \| skipped: \d+ \| ETA: \d+:\d\d:\d\d$")


@pytest.mark.multiproc
def test_a_launched_job_logs_one_line_per_interval_and_no_bar(corpus, tmp_path):
    logs, run = tmp_path / "logs", tmp_path / "run"
    r = run_launch("train.sh", RECIPE, "--num-gpus", 2, "--backend", "local", "--master-port", free_port(),
                   "--log-dir", logs, "--quiet", "--", f"data.manifests=[{corpus}]", f"checkpoint.dir={run}",
                   f"training.train_steps={STEPS}", f"training.log_interval={INTERVAL}",
                   env=launch_env(OMP_NUM_THREADS=1, PYTHONWARNINGS="ignore", CUDA_VISIBLE_DEVICES=""), timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    files = sorted(logs.glob("*.log"))
    assert files, f"no log files in {logs}"
    text = "".join(p.read_text() for p in files)
    assert "\r" not in text, "carriage-return progress output in a log file"
    assert "it/s]" not in text and "step/s]" not in text  # tqdm's rate field: no bar at all
    lines = [m for line in text.splitlines() if (m := LINE.search(line))]
    assert [int(m.group(1)) for m in lines] == list(range(INTERVAL, STEPS + 1, INTERVAL)), text[-4000:]
    # nothing else shaped like a line (a partial one, another rank's copy)
    assert len(re.findall(r"iteration +\d+/", text)) == STEPS // INTERVAL, text[-4000:]
    records = {rec["step"]: rec for rec in metrics(run) if "loss" in rec}
    for m in lines:
        rec = records[int(m.group(1))]
        assert int(m.group(2)) == STEPS and int(m.group(3)) == rec["consumed_samples"]
        assert float(m.group(5)) == pytest.approx(rec["loss"], rel=1e-6)  # printed to 7 significant digits
        assert float(m.group(4)) == pytest.approx(rec["lr"], rel=1e-6)
        assert float(m.group(6)) == pytest.approx(rec["grad_norm"], abs=1e-3)


RECORD = {"step": 40, "loss": 2.5, "lr": 1.5e-4, "grad_norm": 0.75, "tokens_per_s": 12345.6, "tflops_per_gpu": 412.0,
          "mfu": 0.4166, "mem_gb": 61.25, "consumed_samples": 10240, "nan_skips_total": 1}


@pytest.mark.unit
def test_the_line_carries_megatrons_figures_and_the_eta():
    line = interval_line(RECORD, total=100, per_step_s=1.5)
    assert LINE.search(line), line
    # Hand-computed: 60 steps left at 1.5 s = 90 s.
    for part in ("iteration       40/     100", "consumed samples:      10240", "elapsed time per iteration (ms): "
                 "1500.0", "learning rate: 1.500000E-04", "lm loss: 2.500000E+00", "grad norm: 0.750",
                 "tokens/s: 12,346", "TFLOP/s/GPU: 412", "MFU: 41.66%", "mem: 61.25 GB", "skipped: 1",
                 "ETA: 0:01:30"):
        assert part in line, (part, line)
    assert "grad norm: n/a" in interval_line({**RECORD, "grad_norm": None}, 100, 1.0)


@pytest.mark.unit
def test_lines_only_on_the_interval_and_the_bar_only_on_a_terminal(capsys):
    lines = progress(True, total=100, initial=38, terminal=False)
    assert isinstance(lines, IntervalLines)
    lines.update({**RECORD, "step": 39}, interval=False)
    lines.update(RECORD, interval=True)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("iteration       40/")
    bar = progress(True, total=100, initial=38, terminal=True)
    assert isinstance(bar, ProgressBar)
    bar.close()
    quiet = progress(False, total=100, initial=0, terminal=True)
    quiet.update(RECORD, interval=True)
    assert capsys.readouterr().out == ""
