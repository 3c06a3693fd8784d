"""The ZeRO stages: the strategy protocol and registry (base.py); stages 0-2 as one strategy
composed of a sharding policy (sharding.py), a gradient reduction (reduction.py, stage0-2.py)
and an optimizer placement (placement.py), run by whole_params.py; offload.py names the
offloaded combinations; stage 3 in stage3/; tensor_parallel_norm.py gives any of them a clip
norm over the data and tensor axes."""
