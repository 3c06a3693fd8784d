"""``deepspeed.profiling.flops_profiler`` (and its ``.profiler``): ``get_model_profile``, ``FlopsProfiler``."""
from launcher.zero.flops.profiler import FlopsProfiler, get_model_profile

__all__ = ["FlopsProfiler", "get_model_profile"]
