"""The data loader both engines hand out: DeepSpeed's per-rank sampler, micro-batches, a repeating loader."""
