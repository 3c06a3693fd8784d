"""``deepspeed.profiling.flops_profiler``: ``get_model_profile``, ``FlopsProfiler``."""
from launcher.zero.flops.profiler import FlopsProfiler, get_model_profile

__all__ = ["FlopsProfiler", "get_model_profile"]
