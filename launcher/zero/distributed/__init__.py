"""The distributed context (rank, world, device, group), collectives over it, the accelerator."""
