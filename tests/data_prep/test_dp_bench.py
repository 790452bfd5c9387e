"""`python -m data_prep bench` on a tiny corpus: every family measured (ours, bare gigatoken, the bare library),
identical token counts, the summary table."""

import re

import pytest
from tests.support.data_prep import run_cli

from data_prep.tools.bench import FAMILIES

pytestmark = pytest.mark.multiproc


def test_bench_prints_a_row_per_family(tmp_path):
    r = run_cli("bench", tmp_path / "b", "--corpus-mb", "0.4", "--scale", "2", "-j", "1", "--vocab-size", "700",
                timeout=600)
    out = r.stdout
    for family in FAMILIES:
        section = out.split(f"-- {family}: ours encodes with ", 1)[1].split("\n-- ", 1)[0]
        assert section.startswith(("gigatoken", "tiktoken")), section[:200]
        for run in ("bare", "gigatoken", "ours", "ours, 2x corpus"):
            assert re.search(rf"^   {re.escape(run)}\s+[\d.]+\s+[\d.]+\s+[\d.]+", section, re.M), (run, section[:600])
    header = next(line for line in out.splitlines() if line.startswith("| family |"))
    assert header.count("|") == 13 and "ours vs gigatoken" in header and "ours vs Megatron fast" in header
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| family")]
    assert [row.split(" | ")[0][2:] for row in rows] == list(FAMILIES)
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 12 and cells[1] in ("gigatoken", "tiktoken") and cells[5] == cells[6] == "-", row
        assert re.fullmatch(r"[\d.]+x; [\d.]+x", cells[7]) and re.fullmatch(r"[\d.]+x; [\d.]+x", cells[8])
        assert re.fullmatch(r"\d+ MB -> \d+ MB \([\d.]+\)", cells[11])
    assert "token counts differ" not in out


@pytest.mark.parametrize("args,message", [(["--megatron-lm", "/nonexistent/Megatron-LM"], "no tools/preprocess_data.py"),
                                          (["--megatron-lm-fast", "/nonexistent/Megatron-LM"],
                                           "no tools/preprocess_data_fast.py"),
                                          (["--family", "wordpiece"], "unknown family")])
def test_bench_refuses_bad_options_before_any_work(tmp_path, args, message):
    r = run_cli("bench", tmp_path / "b", *args, check=False)
    assert r.returncode == 2 and message in r.stderr
    assert not (tmp_path / "b" / "corpus_1x").exists()
