"""Training: engine (DeepSpeed + megatron-core), data (GPTDataset over manifests), the loop, the `train` CLI."""
