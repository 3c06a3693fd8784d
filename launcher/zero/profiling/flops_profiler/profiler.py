"""``deepspeed.profiling.flops_profiler.profiler``: where DeepSpeed defines ``FlopsProfiler``."""
from launcher.zero.flops.profiler import FlopsProfiler, get_model_profile

__all__ = ["FlopsProfiler", "get_model_profile"]
