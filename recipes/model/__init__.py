"""Model knowledge: shape arithmetic (`shape`: parameters, FLOPs) and the megatron-core layers (`layers`)."""
