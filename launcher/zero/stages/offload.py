"""ZeRO-Offload at stages 1 and 2: the same partitioning and gradient reduction as without
offload, with the optimizer placed in host memory (placement.OnHost). The optimizer (our
CPUAdam when the config asks for Adam) steps the host masters; the updated slice is copied back
and all-gathered. With ``offload_optimizer.ratio`` below 1 a leading piece of each rank's
partition keeps its master and states on the device (whole_params.py's pieces). Stage 3's
offload lives in the stage-3 strategy itself."""
from __future__ import annotations

from launcher.zero.stages.sharding import Sharded
from launcher.zero.stages.placement import OnHost
from launcher.zero.stages.stage1 import ReduceAtBoundary
from launcher.zero.stages.stage2 import ReduceEveryMicroStep
from launcher.zero.stages.whole_params import WholeParamsStrategy


class Stage1OffloadStrategy(WholeParamsStrategy):
    stage = 1
    partitioning_policy = Sharded
    reduction_policy = ReduceAtBoundary
    placement_policy = OnHost


class Stage2OffloadStrategy(WholeParamsStrategy):
    stage = 2
    partitioning_policy = Sharded
    reduction_policy = ReduceEveryMicroStep
    placement_policy = OnHost
