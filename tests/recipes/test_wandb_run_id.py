"""Which W&B run a training run logs into (recipes.train.tracking.run_id): its own, kept in its log dir and its
checkpoints, across restarts; never, unasked, the one a checkpoint brought from elsewhere names (round 4 of the
security read: its id was used as found); the user's explicit logging.wandb.run_id always."""
from __future__ import annotations

import logging

import pytest

from recipes.train.tracking import ID_FILE, run_id

pytestmark = pytest.mark.unit


def test_a_checkpoints_wandb_run_is_resumed_only_by_the_run_that_started_it(tmp_path, caplog):
    logs = tmp_path / "logs"
    logs.mkdir()
    first, new = run_id(None, logs, "tiny")
    assert new and (logs / ID_FILE).read_text().strip() == first
    assert run_id(first, logs, "tiny") == (first, False)  # a restart: the checkpoint and the log dir agree
    assert run_id(None, logs, "tiny") == (first, False)  # a crash before the first save
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with caplog.at_level(logging.WARNING, logger="recipes.train.tracking"):
        theirs, new = run_id("their-run-1234", elsewhere, "tiny")  # a copied checkpoint, a log dir that never had it
    assert new and theirs != "their-run-1234"
    assert "set logging.wandb.run_id=their-run-1234" in caplog.text
    assert run_id("their-run-1234", elsewhere, "tiny", chosen="their-run-1234") == ("their-run-1234", False)
