"""Checkpoints: save/resume with completion markers (`store`, sync or async through `writer` / `shm_writer`), reading
files as data only (`safe_load`), one run per directory (`lease`), the recipe kept beside them (`recipe_file`), and
`format/`: DeepSpeed's file layout in one place (tags and markers,
file names, reading any layout, re-laying, TP shard rules, the full state directory, DeepSpeed's private helpers).

Writing a full state back through an engine built at the target layout needs the training engine, so its rank
entry point lives in `recipes.train.state_writer`; the reshape CLI that combines both is `recipes.tools.reshape`."""
