"""DeepSpeed classes and functions scripts import that this engine has not built: one list.

Each imports; calling it (or reading one of its attributes) raises ``NotSupportedError`` naming the
feature, so a script that imports them at the top and never uses them runs. The face re-exports
them under DeepSpeed's names (``deepspeed.init_inference``).
Whole modules that are not built are ``NotBuilt`` entries of ``paths.DEEPSPEED_PATHS`` instead.
"""
from __future__ import annotations

from launcher.zero.errors import not_built

_KERNELS = "DeepSpeed's fused transformer kernels and kernel injection"
_INFERENCE = "DeepSpeed inference (init_inference)"

DeepSpeedConfig = not_built("deepspeed.DeepSpeedConfig", "DeepSpeed's config object",
                            hint="zero.load_config(path_or_dict) reads and checks a DeepSpeed config")
DeepSpeedTransformerConfig = not_built("deepspeed.DeepSpeedTransformerConfig", _KERNELS)
DeepSpeedTransformerLayer = not_built("deepspeed.DeepSpeedTransformerLayer", _KERNELS)
replace_transformer_layer = not_built("deepspeed.replace_transformer_layer", _KERNELS)
init_inference = not_built("deepspeed.init_inference", _INFERENCE)
tp_model_init = not_built("deepspeed.tp_model_init", "DeepSpeed's automatic tensor parallelism (AutoTP)",
                          hint="pass mpu= to zero.initialize with your own tensor-parallel layers")

_SEQUENCE = "DeepSpeed's Ulysses sequence-parallel groups (deepspeed.utils.groups._get_sequence_parallel_*)"
_SEQUENCE_HINT = "leave sequence parallelism off (sp_size 1), or run this script with DeepSpeed itself"
_get_sequence_parallel_group = not_built("deepspeed.utils.groups._get_sequence_parallel_group", _SEQUENCE, hint=_SEQUENCE_HINT)
_get_sequence_parallel_rank = not_built("deepspeed.utils.groups._get_sequence_parallel_rank", _SEQUENCE, hint=_SEQUENCE_HINT)
_get_sequence_parallel_world_size = not_built("deepspeed.utils.groups._get_sequence_parallel_world_size", _SEQUENCE,
                                              hint=_SEQUENCE_HINT)

_WRAPPERS = ("DeepSpeed's 16-bit optimizer wrappers (initialize returns this engine's ZeRO optimizer at every stage; "
             "an isinstance check against this type is False)")
_WRAPPERS_HINT = "build your torch optimizer (or name it in the config) and pass it to initialize"
FP16_Optimizer = not_built("deepspeed.runtime.fp16.fused_optimizer.FP16_Optimizer", _WRAPPERS, hint=_WRAPPERS_HINT)
FP16_UnfusedOptimizer = not_built("deepspeed.runtime.fp16.unfused_optimizer.FP16_UnfusedOptimizer", _WRAPPERS,
                                  hint=_WRAPPERS_HINT)
BF16_Optimizer = not_built("deepspeed.runtime.bf16_optimizer.BF16_Optimizer", _WRAPPERS, hint=_WRAPPERS_HINT)

