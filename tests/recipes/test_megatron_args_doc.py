"""docs/megatron_args.md cannot go stale: every recipe key its table names exists in the recipe schema, and the table
covers at least the 40 Megatron-LM arguments it promises."""
from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

from recipes.config.schema import Recipe

pytestmark = pytest.mark.unit

DOC = Path(__file__).resolve().parents[2] / "docs" / "megatron_args.md"


def table_rows() -> list[list[str]]:
    rows = [line.strip().strip("|").split(" | ") for line in DOC.read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| Megatron-LM argument")]
    assert rows and all(len(r) == 4 for r in rows), [r for r in rows if len(r) != 4]
    return rows


def schema_has(path: str) -> bool:
    """recipe key `a.b.c` (a list section as `stages[]`) -> whether the pydantic schema has that field."""
    model: typing.Any = Recipe
    for part in path.split("."):
        is_list_item = part.endswith("[]")
        field = getattr(model, "model_fields", {}).get(part.removesuffix("[]"))
        if field is None:
            return False
        model = field.annotation
        if typing.get_origin(model) is typing.Union:  # Optional[Section]
            model = next(a for a in typing.get_args(model) if a is not type(None))
        if is_list_item:
            if typing.get_origin(model) is not list:
                return False
            model = typing.get_args(model)[0]
    return True


def test_every_recipe_key_in_the_table_exists_in_the_schema():
    keys = []
    for megatron, recipe_keys, _nemo, _notes in table_rows():
        found = re.findall(r"`([^`]+)`", recipe_keys)
        assert found or recipe_keys == "no equivalent", (megatron, recipe_keys)
        keys += found
    missing = [k for k in keys if not schema_has(k)]
    assert not missing, f"docs/megatron_args.md names recipe keys the schema lacks: {missing}"
    assert schema_has("data.stages[].lr") and not schema_has("model.max_position_embeddings")  # the walk can fail


def test_the_table_covers_at_least_40_megatron_arguments():
    flags = {f for row in table_rows() for f in re.findall(r"--[a-z0-9-]+", row[0])}
    assert len(flags) >= 40, sorted(flags)
    for flag in ("--tensor-model-parallel-size", "--use-distributed-optimizer", "--swiglu", "--wandb-project",
                 "--untie-embeddings-and-output-weights", "--recompute-granularity", "--train-samples"):
        assert flag in flags
