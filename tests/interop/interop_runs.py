"""Constants of the checkpoint-interop tests (a uniquely named module, not conftest, so that test files import it
whatever other conftest.py pytest loaded first). Runs and corpora come from tests.support."""
from __future__ import annotations

from pathlib import Path

from tests.support.runs import RECIPE, REPO  # noqa: F401 (re-exported for the interop tests)

VOCAB = 512
EOD = 2  # sentencepiece </s>


def run_overrides(corpus: dict, run_dir: Path) -> list[str]:
    return [f"data.manifests=[{corpus['manifest']}]", f"model.vocab_size={VOCAB}", f"checkpoint.dir={run_dir}",
            "training.eval_interval=1000"]


class Run:
    def __init__(self, path: Path, config: str, overrides: list[str]):
        self.path, self.config, self.overrides = path, config, overrides

    def recipe(self):
        from recipes.config.loading import load_recipe

        return load_recipe(self.config, self.overrides)
