"""The ZeRO stages: the strategy protocol and registry (base.py), stages 0-2 over whole parameters
(whole_params.py, partitioned_masters.py, stage0-2.py), optimizer offload (offload.py), stage 3."""
