"""``deepspeed.profiling``: the flops profiler (``deepspeed.profiling.flops_profiler``)."""
from launcher.zero.profiling import flops_profiler

__all__ = ["flops_profiler"]
