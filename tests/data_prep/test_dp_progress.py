"""The progress bar counts input bytes and cannot run ahead of the work on compressed inputs."""
import queue

import pytest

from data_prep.progress import Progress


@pytest.mark.unit
def test_text_read_from_a_compressed_unit_is_capped_at_its_input_size():
    # two .zst units of 100 input bytes each, whose text is 4x larger once decompressed
    with Progress({0: 100, 1: 100}, quiet=True) as bar:
        q = queue.SimpleQueue()
        q.put((0, 5, 50, 250))  # unit 0 has read 250 characters of its ~400
        bar.drain(q)
        assert bar.position == 100  # not 250 (more than the unit) and not 200 (the whole run)
        q.put((1, 1, 10, 40))
        bar.drain(q)
        assert bar.position == 140
        bar.unit_done(0)
        assert bar.position == 140 and bar.inflight == {1: 40}
        bar.unit_done(1)
        assert bar.position == bar.total == 200
        assert (bar.docs, bar.tokens, bar.chars) == (6, 60, 290)


@pytest.mark.multiproc
def test_a_real_run_reports_every_unit(tmp_path, texts, sp_model):
    """Worker messages carry their unit; at the end the bar has counted exactly the input bytes of all units."""
    import zstandard
    from tests.support.data_prep import write_jsonl

    from data_prep.pipeline import Settings, run

    for i in range(3):
        write_jsonl(tmp_path / f"p{i}.jsonl", [{"text": t} for t in texts[i::3]])
        raw = (tmp_path / f"p{i}.jsonl").read_bytes()
        (tmp_path / f"p{i}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
        (tmp_path / f"p{i}.jsonl").unlink()
    seen = []
    real_init = Progress.__init__

    def spy(self, unit_bytes, quiet=False):
        real_init(self, unit_bytes, quiet)
        seen.append(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Progress, "__init__", spy)
        m = run(Settings(inputs=[str(tmp_path)], output_dir=str(tmp_path / "out"), tokenizer=sp_model, workers=2,
                         quiet=True))
    (bar,) = seen
    assert len(bar.unit_bytes) == 3 and bar.position == bar.total == sum(
        (tmp_path / f"p{i}.jsonl.zst").stat().st_size for i in range(3))
    assert bar.inflight == {} and bar.docs == m["totals"]["documents"] > 10
    assert bar.tokens == m["totals"]["tokens"]
