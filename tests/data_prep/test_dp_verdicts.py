"""The hash pass's quality verdicts carried to the filter pass: used when they are this run's, and then the filter
pass gives the bytes it gives evaluating the rules itself; refused (and the rules evaluated again) when the file
was changed, truncated, written for other settings or by an older version."""

import logging

import numpy as np
import orjson
import pytest
from tests.data_prep.quality_reference import ReferenceQualityFilter
from tests.support.data_prep import tree_bytes, write_jsonl

from data_prep.curate import context
from data_prep.read.units import list_inputs, plan_units
from data_prep.steps import curate as cu
from data_prep.steps.filters import QualityConfig
from data_prep.steps.step_list import step_list

pytestmark = pytest.mark.unit

STEPS = {"steps": [{"quality": {"min_words": 20}}, {"exact_dedup": {}}, {"quality": {"min_stop_words": 4},
                                                                         "name": "strict"},
                   {"minhash_dedup": {}}], "buckets": 4}


@pytest.fixture(scope="module")
def inputs(texts, tmp_path_factory):
    d = tmp_path_factory.mktemp("verdict_in")
    docs = [t[:3000] for t in texts[:160]]
    files = {f"{k}.jsonl": docs[k * 40:(k + 1) * 40] for k in range(4)}
    files["3.jsonl"] = files["3.jsonl"] + docs[:5]  # exact copies in another unit: removed by exact_dedup
    for name, part in files.items():
        write_jsonl(d / name, [{"text": t} for t in part])
    return d, files


def _dedup_passes(inp, out):
    units = plan_units(list_inputs([str(inp)]), 20_000)
    ctx = context(str(out), step_list(STEPS), units, "text", 20_000, 1 << 20)
    for u in units:
        assert cu.hash_unit(u, ctx)["ok"]
    for b in range(ctx.steps.buckets):
        cu.bucket_task(cu.Bucket(b), ctx)
    cu.cluster_pass(ctx)
    return ctx, units


def _filter(ctx, units):
    """The filter pass; returns how many (unit, quality step) evaluate the rules themselves (no verdicts carried)."""
    live = 0
    for u in units:
        assert cu.filter_unit(u, ctx)["ok"]
        live += sum(how.codes is None for _, how in cu.DocGate(ctx, u.index).checks if hasattr(how, "codes"))
    return live


def _outputs(out):
    return {k: v for k, v in tree_bytes(out).items() if not k.startswith("dedup")}


@pytest.fixture(scope="module")
def carried(inputs, tmp_path_factory):
    """One run with the verdicts carried: its output directory and how many steps evaluated the rules again."""
    out = tmp_path_factory.mktemp("carried")
    ctx, units = _dedup_passes(inputs[0], out)
    return out, units, _filter(ctx, units)


def test_carried_verdicts_give_the_bytes_of_evaluating_the_rules_and_the_reference_verdicts(inputs, carried,
                                                                                            tmp_path):
    inp, files = inputs
    out, units, live = carried
    assert len(units) >= 3
    assert live == 0  # every verdict came from the hash pass
    live_ctx, _ = _dedup_passes(inp, tmp_path / "live")  # the same passes, the verdict files gone: rules run again
    for p in (tmp_path / "live" / "dedup").glob("*.verdicts_*.npy"):
        p.unlink()
    assert _filter(live_ctx, units) == 2 * len(units)
    assert _outputs(tmp_path / "live") == _outputs(out)
    # the first quality step's removals are those of the plain per-word reference
    ref = ReferenceQualityFilter(QualityConfig(min_words=20))
    removed = [orjson.loads(x) for p in out.glob("*.removed.jsonl")
               for x in p.read_bytes().splitlines()]
    got = sorted((r["file"], r["byte_offset"]) for r in removed if r["step"] == "quality")
    want = []
    for name, docs in files.items():
        offsets = np.cumsum([0] + [len(orjson.dumps({"text": t})) + 1 for t in docs]).tolist()
        want += [(str(inp / name), offsets[i]) for i, t in enumerate(docs) if ref.check(t) is not None]
    assert got == sorted(want)
    assert len(got) and any(r["step"] == "strict" for r in removed)


@pytest.mark.parametrize("damage", ["flip", "truncate", "stale_marker", "old_marker"])
def test_a_damaged_or_foreign_verdict_file_is_refused_and_the_rules_run_again(inputs, carried, tmp_path, caplog,
                                                                             damage):
    inp, _ = inputs
    want = _outputs(carried[0])
    ctx, units = _dedup_passes(inp, tmp_path / "out")
    path = tmp_path / "out" / "dedup" / f"quality.verdicts_{units[0].index:06d}.npy"
    marker = tmp_path / "out" / "dedup" / f"hash_{units[0].index:06d}.json"
    m = orjson.loads(marker.read_bytes())
    if damage == "flip":  # a "kept" verdict turned into a removal: the SHA-256 no longer matches
        data = bytearray(path.read_bytes())
        data[data.index(bytes([0]), 128)] = 1
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[:-3])
    elif damage == "stale_marker":  # the marker of another run's settings: not this run's hash pass
        marker.write_bytes(orjson.dumps(m | {"fingerprint": "0" * 64}))
    else:  # a marker written before verdicts were carried
        marker.write_bytes(orjson.dumps({k: v for k, v in m.items() if k != "verdicts"}))
    with caplog.at_level(logging.WARNING, logger="data_prep.steps.curate"):
        live = _filter(ctx, units)
    assert live == (1 if damage in ("flip", "truncate") else 2)  # that file, or both steps of that unit
    assert "evaluating the quality rules again" in caplog.text
    assert _outputs(tmp_path / "out") == want
