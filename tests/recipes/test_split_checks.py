"""A split that gets no document hangs megatron-core's dataset (its epoch count never reaches the samples asked for):
found before any rank starts, with a split that works. The documents per split are megatron-core's own (its split
matrix and rounding, imported here as the reference; the planner does not import it)."""
import json

import pytest

from recipes.planner.split_checks import documents_per_split
from tests.recipes.test_validation_launch import problems

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("split", ["98,2,0", "90,10,0", "969,30,1", "1,0,0", "99/1/0", "50,50"])
def test_documents_per_split_are_megatron_cores(split):
    from megatron.core.datasets.blended_megatron_dataset_config import (convert_split_vector_to_split_matrix,
                                                                        parse_and_normalize_split)

    matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(split))
    for n in (1, 3, 16, 17, 49, 50, 51, 100, 12345):
        want = [0 if b is None else int(round(b[1] * n)) - int(round(b[0] * n)) for b in matrix[:2]]
        assert documents_per_split(split, n) == want, (split, n)


def _manifest(d, documents):
    d.mkdir(parents=True)
    for ext in (".bin", ".idx"):
        (d / f"shard_000000{ext}").write_bytes(b"")
    (d / "manifest.json").write_text(json.dumps({"tokenizer": {"vocab_size": 257, "eod_id": 256}, "dtype": "uint16",
                                                 "shards": [{"prefix": "shard_000000", "documents": documents,
                                                             "tokens": 100 * documents}]}))
    return d / "manifest.json"


def test_a_validation_split_without_documents_is_refused_with_a_split_that_works(tmp_path):
    m = _manifest(tmp_path / "d", 16)  # 98,2,0 of 16 documents: validation gets round(16) - round(15.68) = 0
    [p] = problems(tmp_path, f"data.manifests=[{m}]", "data.split=98,2,0")
    assert p.field == "data.split"
    assert str(p) == (f"data.split = 98,2,0: the validation split of data.manifests[0] ({m}, 16 documents) gets no "
                      "document, and megatron-core's dataset never returns for an empty split it must sample; give "
                      "it a larger share, e.g. data.split=91,9,0, or tokenize more documents")
    assert documents_per_split("91,9,0", 16) == [15, 1]  # the fix it names works
    assert problems(tmp_path, f"data.manifests=[{m}]", "data.split=91,9,0") == []
    assert problems(tmp_path, f"data.manifests=[{_manifest(tmp_path / 'big', 1000)}]", "data.split=98,2,0") == []
