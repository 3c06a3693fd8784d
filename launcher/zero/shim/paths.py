"""Every DeepSpeed module path ``--as-deepspeed`` answers, and what answers it: one table.

A path maps to one of our public modules (the very module object: one set of classes whichever
name a script uses), or to ``NotBuilt``: the import works and using any of its names raises
``NotSupportedError`` naming the feature. A ``deepspeed.X`` not in this table does not import,
so an engine internal can never be reached as ``deepspeed.<something>``.
"""
from __future__ import annotations

from dataclasses import dataclass

#: the DeepSpeed release whose behaviour this engine matches: ``deepspeed.__version__`` and the
#: ``deepspeed`` package metadata report it while the shim is active
DEEPSPEED_VERSION = "0.19.8"


@dataclass(frozen=True)
class NotBuilt:
    """A DeepSpeed module this engine does not have yet: importable, every name raises."""

    feature: str
    hint: str = "run this script with DeepSpeed itself"


_DATA_PIPELINE = NotBuilt("DeepSpeed's data efficiency library (deepspeed.runtime.data_pipeline: curriculum "
                          "learning, random-LTD, data analysis, variable batch size)")
_DOMINO = NotBuilt("DeepSpeed-Domino (deepspeed.runtime.domino)")
_ULYSSES = NotBuilt("DeepSpeed-Ulysses sequence parallelism (deepspeed.runtime.sequence_parallel)",
                    hint="leave sequence parallelism off (sp_size 1), or run this script with DeepSpeed itself")
_LAUNCHER = NotBuilt("DeepSpeed's own launcher (deepspeed.launcher)",
                     hint="start the job with dslaunch (accelerate launch's DeepSpeed mode runs DeepSpeed's launcher)")
_KERNELS = NotBuilt("DeepSpeed's kernel injection (deepspeed.module_inject)")

DEEPSPEED_PATHS: dict[str, str | NotBuilt] = {
    "deepspeed": "launcher.zero",
    "deepspeed.accelerator": "launcher.zero.accelerator",
    "deepspeed.comm": "launcher.zero.comm",
    "deepspeed.utils": "launcher.zero.utils",
    "deepspeed.utils.zero_to_fp32": "launcher.zero.utils.zero_to_fp32",
    "deepspeed.utils.logging": "launcher.zero.utils.logging",
    "deepspeed.utils.module_utils": "launcher.zero.utils.module_utils",
    "deepspeed.utils.init_on_device": "launcher.zero.utils.init_on_device",
    "deepspeed.utils.tensor_fragment": "launcher.zero.utils.tensor_fragment",
    "deepspeed.utils.z3_leaf_module": "launcher.zero.utils.z3_leaf_module",
    "deepspeed.git_version_info": "launcher.zero.git_version_info",
    "deepspeed.compression": NotBuilt("DeepSpeed's compression library (deepspeed.compression); only its helper "
                                      "module is built"),
    "deepspeed.compression.helper": "launcher.zero.utils.module_utils",
    "deepspeed.launcher": _LAUNCHER,
    "deepspeed.launcher.runner": _LAUNCHER,
    "deepspeed.module_inject": _KERNELS,
    "deepspeed.zero": "launcher.zero.zero",
    "deepspeed.checkpointing": "launcher.zero.checkpointing",
    "deepspeed.runtime": "launcher.zero.runtime",
    "deepspeed.runtime.utils": "launcher.zero.runtime.utils",
    "deepspeed.runtime.lr_schedules": "launcher.zero.runtime.lr_schedules",
    "deepspeed.runtime.engine": "launcher.zero.runtime.engine",
    "deepspeed.runtime.base_optimizer": "launcher.zero.runtime.base_optimizer",
    "deepspeed.runtime.zero": "launcher.zero.zero",
    "deepspeed.runtime.zero.partition_parameters": "launcher.zero.zero.partition_parameters",
    "deepspeed.runtime.zero.offload_config": "launcher.zero.zero.offload_config",
    "deepspeed.runtime.zero.config": "launcher.zero.zero.config",
    "deepspeed.runtime.zero.tiling": "launcher.zero.zero.tiling",
    "deepspeed.runtime.config": "launcher.zero.runtime.config",
    "deepspeed.runtime.config_utils": "launcher.zero.runtime.config_utils",
    "deepspeed.runtime.fp16": "launcher.zero.runtime.fp16",
    "deepspeed.runtime.fp16.loss_scaler": "launcher.zero.runtime.fp16.loss_scaler",
    "deepspeed.runtime.fp16.fused_optimizer": "launcher.zero.runtime.fp16.fused_optimizer",
    "deepspeed.runtime.fp16.unfused_optimizer": "launcher.zero.runtime.fp16.unfused_optimizer",
    "deepspeed.runtime.bf16_optimizer": "launcher.zero.runtime.bf16_optimizer",
    "deepspeed.runtime.data_pipeline": _DATA_PIPELINE,
    "deepspeed.runtime.data_pipeline.data_routing": _DATA_PIPELINE,
    "deepspeed.runtime.data_pipeline.data_routing.helper": _DATA_PIPELINE,
    "deepspeed.runtime.data_pipeline.data_sampling": _DATA_PIPELINE,
    "deepspeed.runtime.data_pipeline.data_sampling.data_analyzer": _DATA_PIPELINE,
    "deepspeed.runtime.data_pipeline.data_sampling.indexed_dataset": _DATA_PIPELINE,
    "deepspeed.runtime.data_pipeline.data_sampling.variable_batch_size_and_lr": _DATA_PIPELINE,
    "deepspeed.runtime.domino": _DOMINO,
    "deepspeed.runtime.domino.transformer": _DOMINO,
    "deepspeed.runtime.sequence_parallel": _ULYSSES,
    "deepspeed.runtime.sequence_parallel.ulysses_sp": _ULYSSES,
    "deepspeed.runtime.activation_checkpointing": NotBuilt(
        "deepspeed.runtime.activation_checkpointing (only its 'checkpointing' module is built)"),
    "deepspeed.runtime.activation_checkpointing.checkpointing": "launcher.zero.checkpointing",
    "deepspeed.runtime.pipe": "launcher.zero.pipe",
    "deepspeed.runtime.pipe.module": "launcher.zero.pipe",
    "deepspeed.runtime.pipe.topology": "launcher.zero.pipe",
    "deepspeed.runtime.pipe.engine": "launcher.zero.pipe",
    "deepspeed.runtime.pipe.schedule": NotBuilt("DeepSpeed's pipeline instruction schedules (deepspeed.runtime.pipe.schedule)"),
    "deepspeed.pipe": "launcher.zero.pipe",
    "deepspeed.ops": "launcher.zero.ops",
    "deepspeed.ops.adam": "launcher.zero.ops.adam",
    "deepspeed.ops.lamb": "launcher.zero.ops.lamb",
    "deepspeed.ops.sparse_attention": "launcher.zero.ops.sparse_attention",
    "deepspeed.ops.adagrad": NotBuilt("DeepSpeed's CPU Adagrad (deepspeed.ops.adagrad)",
                                      hint='use "optimizer": {"type": "Adam"} or AdamW, or build torch.optim.Adagrad'),
    "deepspeed.ops.lion": NotBuilt("DeepSpeed's CPU Lion (deepspeed.ops.lion)", hint="build the optimizer yourself"),
    "deepspeed.ops.op_builder": NotBuilt("DeepSpeed's C++/CUDA op builders (deepspeed.ops.op_builder)",
                                         hint="this engine builds no ops; use the optimizers in deepspeed.ops.adam"),
    "deepspeed.checkpoint": NotBuilt("DeepSpeed's checkpoint tools (deepspeed.checkpoint: universal checkpoints, "
                                     "reshaping); only deepspeed.checkpoint.utils is built"),
    "deepspeed.checkpoint.utils": "launcher.zero.utils.torch_save",
    "deepspeed.moe": "launcher.zero.moe",
    "deepspeed.moe.layer": "launcher.zero.moe.layer",
    "deepspeed.moe.utils": "launcher.zero.moe.utils",
    "deepspeed.moe.sharded_moe": "launcher.zero.moe.sharded_moe",
    "deepspeed.moe.experts": "launcher.zero.moe.experts",
    "deepspeed.utils.groups": "launcher.zero.utils.groups",
    "deepspeed.profiling": "launcher.zero.profiling",
    "deepspeed.profiling.flops_profiler": "launcher.zero.profiling.flops_profiler",
    "deepspeed.profiling.flops_profiler.profiler": "launcher.zero.profiling.flops_profiler.profiler",
}
