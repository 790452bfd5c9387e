"""data_prep: tokenize corpora into Megatron .bin/.idx shards — parallel, resumable, lossless. CLI: python -m data_prep."""
