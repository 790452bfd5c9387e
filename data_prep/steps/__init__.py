"""Processing steps run on a unit's records: tokenize.py (the tokenize step, one unit -> shard + stats), with
tokenizers.py (loading), fast_path.py (the exact cached encoder) and train_tokenizer.py (a sentencepiece model)."""
