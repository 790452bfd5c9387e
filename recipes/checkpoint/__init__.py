"""Checkpoints: save/resume with completion markers (`store`), the recipe kept beside them (`recipe_file`), reading
any layout into one full state (`read`), TP shard rules (`shards`), a plain single-process model (`plain_model`).

Writing a full state back as DeepSpeed files needs the training engine, so it lives in `recipes.train.state_writer`;
the reshape CLI that combines both is `recipes.tools.reshape`."""
