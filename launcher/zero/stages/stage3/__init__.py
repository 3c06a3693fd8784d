"""ZeRO stage 3 (parameters partitioned too): the strategy the engine's registry points at."""
from launcher.zero.stages.stage3.strategy import Stage3Strategy

__all__ = ["Stage3Strategy"]
