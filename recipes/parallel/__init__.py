"""Parallel layout: `Layout` (degrees and the one validator of them), DeepSpeed JSON, pipeline partition."""
