"""The engine config as frozen dataclasses, with DeepSpeed 0.19.8's keys and defaults.

Torch-free: `dslaunch --dry-run --config` validates configs without importing torch.
Every field's metadata says how to check it: ``kind`` (bool, int, float, str, dict, any),
optional ``min``/``choices``/``aliases``, and ``doc``. The builder in load.py reads it.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any


def spec(default: Any, kind: str, doc: str, **checks: Any) -> Any:
    """A dataclass field with its checking rules in metadata."""
    factory = checks.pop("factory", None)
    metadata = {"kind": kind, "doc": doc, **checks}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class FP16Config:
    """`fp16`: half precision with DeepSpeed's dynamic loss scaler."""

    enabled: bool = spec(False, "bool", "train in fp16 with fp32 master weights")
    auto_cast: bool = spec(False, "bool", "cast float inputs to fp16")
    loss_scale: float = spec(0.0, "float", "0 means dynamic; > 0 is a static scale", min=0.0)
    initial_scale_power: int = spec(16, "int", "dynamic scale starts at 2**initial_scale_power", min=0)
    loss_scale_window: int = spec(1000, "int", "clean steps between scale doublings", min=1)
    hysteresis: int = spec(2, "int", "overflows tolerated before the scale is halved", min=1)
    consecutive_hysteresis: bool = spec(False, "bool", "refill hysteresis on every clean step")
    min_loss_scale: float = spec(1.0, "float", "floor of the dynamic scale", min_exclusive=0.0)
    fp16_master_weights_and_grads: bool = spec(False, "bool", "keep master weights in fp16 (ZeRO 1-3)")

    @property
    def dynamic(self) -> bool:
        return self.loss_scale == 0


@dataclass(frozen=True)
class BF16Config:
    """`bf16` (alias `bfloat16`): bfloat16 compute with fp32 master weights (bf16 with
    ``bf16_master_weights_and_grads``), no loss scaling."""

    enabled: bool = spec(False, "bool", "train in bf16 with fp32 master weights")
    immediate_grad_update: bool = spec(False, "bool", "accepted for compatibility")
    check_grad_overflow: bool = spec(True, "bool", "skip a step whose gradients hold inf/NaN")
    bf16_master_weights_and_grads: bool = spec(False, "bool", "bf16 master weights and gradients (ZeRO 1-3; with "
                                               "offload_optimizer and its CPU Adam unless bf16_optimizer_states)")
    bf16_optimizer_states: bool = spec(False, "bool", "Adam's moments in bf16 (needs bf16_master_weights_and_grads)")


@dataclass(frozen=True)
class OffloadConfig:
    """`zero_optimization.offload_optimizer` / `offload_param`."""

    device: str = spec("none", "str", "where the tensors live", choices=("none", "cpu", "nvme"))
    nvme_path: str | None = spec(None, "str", "folder for NVMe offload (optimizer states or parameters: one "
                                 "folder per rank inside it)", nullable=True)
    pin_memory: bool = spec(True, "bool", "page-locked host buffers (True in 0.19.8)")
    ratio: float = spec(1.0, "float", "fraction of the optimizer states offloaded; the first 1 - ratio of "
                        "DeepSpeed's sub-groups keep theirs on the device (stages 1-3, device cpu; "
                        "DeepSpeed 0.19.8: stage 3 only)", min=0.0, max=1.0)
    super_offload: bool = spec(False, "bool", "DeepSpeed's SuperOffload (not built: must be false)")
    cpuadam_cores_perc: float = spec(0.8, "float", "with super_offload only: the share of CPU cores its Adam uses",
                                     min=0.0, max=1.0)
    buffer_count: int = spec(4, "int", "number of staging buffers (host slots of NVMe offload)", min=1)
    buffer_size: int = spec(100_000_000, "int", "elements per staging buffer (offload_optimizer nvme: a slot holds "
                            "a third of it of the master and of each moment; offload_param nvme: at least a "
                            "rank's largest parameter shard)", min=1)
    max_in_cpu: int = spec(1_000_000_000, "int", "DeepSpeed's elements kept in CPU memory with offload_param nvme; "
                           "no effect here (every shard is in the file; a note says so)", min=0)
    pipeline_read: bool = spec(False, "bool", "overlap NVMe reads (ours always read ahead)")
    pipeline_write: bool = spec(False, "bool", "overlap NVMe writes (ours always write behind)")
    fast_init: bool = spec(False, "bool", "fast NVMe initialisation")
    overlap_step: bool = spec(False, "bool", "ours, offload_optimizer only: the CPU step runs in the background "
                              "after step() returns; the next forward waits per module for its updated weights")

    @property
    def active(self) -> bool:
        return self.device != "none"


@dataclass(frozen=True)
class ZeroOptimizationConfig:
    """`zero_optimization`: which ZeRO stage, and how it buckets and overlaps communication."""

    stage: int = spec(0, "int", "0 off, 1 optimizer state, 2 + gradients, 3 + parameters", choices=(0, 1, 2, 3))
    contiguous_gradients: bool = spec(True, "bool", "copy grads into a contiguous buffer as produced")
    overlap_comm: bool | None = spec(None, "bool", "overlap reduction with backward (None: True at stage 3)", nullable=True)
    reduce_scatter: bool = spec(True, "bool", "reduce to owners instead of all-reduce")
    reduce_bucket_size: int = spec(500_000_000, "int", "elements reduced per bucket", min_exclusive=0)
    allgather_partitions: bool = spec(True, "bool", "all-gather updated partitions")
    allgather_bucket_size: int = spec(500_000_000, "int", "elements all-gathered at once", min_exclusive=0)
    use_multi_rank_bucket_allreduce: bool = spec(True, "bool", "accepted for compatibility")
    round_robin_gradients: bool = spec(False, "bool", "stage 1/2 offload gradient copy order")
    offload_optimizer: OffloadConfig | None = spec(None, "section", "optimizer state offload", section=OffloadConfig, nullable=True)
    offload_param: OffloadConfig | None = spec(None, "section", "parameter offload (stage 3)", section=OffloadConfig, nullable=True)
    sub_group_size: int = spec(1_000_000_000, "int", "tile size of the optimizer step; with "
                               "offload_optimizer.ratio below 1, the unit (elements per rank) of the cut "
                               "between the states kept on the device and the offloaded ones", min=1)
    stage3_max_live_parameters: int = spec(1_000_000_000, "int", "resident params before release", min=0, aliases=("max_live_parameters",))
    stage3_max_reuse_distance: int = spec(1_000_000_000, "int", "keep params reused within this distance", min=0, aliases=("max_reuse_distance",))
    stage3_prefetch_bucket_size: int = spec(50_000_000, "int", "prefetch size in elements", min=0, aliases=("prefetch_bucket_size",))
    stage3_param_persistence_threshold: int = spec(100_000, "int", "params smaller than this stay whole", min=0, aliases=("param_persistence_threshold",))
    stage3_model_persistence_threshold: int = spec(sys.maxsize, "int", "cap on persistent elements", min=0, aliases=("model_persistence_threshold",))
    stage3_gather_16bit_weights_on_model_save: bool = spec(False, "bool", "consolidate weights in save_16bit_model", aliases=("gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save"))
    stage3_module_granularity_threshold: int = spec(0, "int", "accepted for compatibility", min=0, aliases=("module_granularity_threshold",))
    stage3_use_all_reduce_for_fetch_params: bool = spec(False, "bool", "accepted for compatibility", aliases=("use_all_reduce_for_fetch_params",))
    load_from_fp32_weights: bool = spec(True, "bool", "init masters from the checkpoint's fp32 copies")
    elastic_checkpoint: bool = spec(False, "bool", "accepted for compatibility")
    ignore_unused_parameters: bool = spec(True, "bool", "unused parameters get zero gradients")
    legacy_stage1: bool = spec(False, "bool", "accepted for compatibility")
    memory_efficient_linear: bool = spec(True, "bool", "accepted for compatibility")
    pipeline_loading_checkpoint: bool = spec(False, "bool", "accepted for compatibility")
    override_module_apply: bool = spec(True, "bool", "accepted for compatibility")
    log_trace_cache_warnings: bool = spec(False, "bool", "accepted for compatibility")
    zero_hpz_partition_size: int = spec(1, "int", "ZeRO++ hpZ (not built: must be 1)", min=1)
    zero_quantized_weights: bool = spec(False, "bool", "ZeRO++ qwZ (not built: must be false)")
    zero_quantized_nontrainable_weights: bool = spec(False, "bool", "ZeRO++ quantized frozen weights (not built: "
                                                     "must be false)")
    zero_quantized_gradients: bool = spec(False, "bool", "ZeRO++ qgZ (not built: must be false)")
    mics_shard_size: int = spec(-1, "int", "MiCS (not built, and removed from DeepSpeed 0.19: must be -1)")
    mics_hierarchical_params_gather: bool = spec(False, "bool", "MiCS (not built, and removed from DeepSpeed 0.19: "
                                                 "must be false)")
    zenflow: dict | None = spec(None, "dict", "DeepSpeed's ZenFlow (not built: must be null)",
                                nullable=True)
    cpu_offload: bool | None = spec(None, "bool", "legacy: true means offload_optimizer.device=cpu", nullable=True)
    cpu_offload_params: bool | None = spec(None, "bool", "legacy: offload_param.device=cpu", nullable=True, aliases=("cpu_offload_param",))
    cpu_offload_use_pin_memory: bool | None = spec(None, "bool", "legacy pin_memory", nullable=True)

    @property
    def offload_optimizer_active(self) -> bool:
        return self.offload_optimizer is not None and self.offload_optimizer.active


@dataclass(frozen=True)
class NamedConfig:
    """`optimizer` / `scheduler`: a type name and the constructor's keyword arguments."""

    type: str = spec("", "str", "class name (DeepSpeed names case-insensitive, else torch)")
    params: dict = spec(None, "dict", "constructor keyword arguments", factory=dict)


@dataclass(frozen=True)
class ActivationCheckpointingConfig:
    """`activation_checkpointing`: used only through launcher.zero.checkpointing."""

    partition_activations: bool = spec(False, "bool", "shard saved activations across model-parallel ranks")
    cpu_checkpointing: bool = spec(False, "bool", "keep checkpointed activations on CPU")
    contiguous_memory_optimization: bool = spec(False, "bool", "copy activations into one buffer")
    number_checkpoints: int | None = spec(None, "int", "number of checkpoints for the buffer", nullable=True, min=1)
    synchronize_checkpoint_boundary: bool = spec(False, "bool", "synchronize at checkpoint boundaries")
    profile: bool = spec(False, "bool", "time the checkpointed forward/backward")


@dataclass(frozen=True)
class MonitorConfig:
    """`csv_monitor` / `tensorboard`: where training metrics go as files."""

    enabled: bool = spec(False, "bool", "write metrics")
    output_path: str = spec("", "str", "folder for the files (default: ./<monitor>)")
    job_name: str = spec("DeepSpeedJobName", "str", "sub-folder name")


@dataclass(frozen=True)
class WandbConfig:
    """`wandb`: the monitor's metrics through the wandb package (rank 0)."""

    enabled: bool = spec(False, "bool", "log metrics to Weights & Biases")
    project: str = spec("deepspeed", "str", "W&B project")
    group: str | None = spec(None, "str", "W&B group of runs", nullable=True)
    team: str | None = spec(None, "str", "W&B team (entity)", nullable=True)
    job_name: str | None = spec(None, "str", "W&B run name (None: W&B picks one)", nullable=True)


@dataclass(frozen=True)
class CometConfig:
    """`comet`: the monitor's metrics through comet_ml (rank 0); ``online: false`` writes an offline archive."""

    enabled: bool = spec(False, "bool", "log metrics to Comet")
    samples_log_interval: int = spec(100, "int", "log a metric again only after this many samples", min=1)
    project: str | None = spec(None, "str", "Comet project", nullable=True)
    workspace: str | None = spec(None, "str", "Comet workspace", nullable=True)
    api_key: str | None = spec(None, "str", "Comet API key (else COMET_API_KEY)", nullable=True)
    experiment_name: str | None = spec(None, "str", "the experiment's name", nullable=True)
    experiment_key: str | None = spec(None, "str", "continue this experiment", nullable=True)
    online: bool | None = spec(None, "bool", "false: an offline experiment (COMET_OFFLINE_DIRECTORY)", nullable=True)
    mode: str | None = spec(None, "str", "get, create or get_or_create", nullable=True,
                            choices=("get", "create", "get_or_create"))


@dataclass(frozen=True)
class FlopsProfilerConfig:
    """`flops_profiler`: count one step's FLOPs per module (torch.utils.flop_counter) and print them on rank 0."""

    enabled: bool = spec(False, "bool", "profile one training step")
    profile_step: int = spec(1, "int", "the global step (0-based, as DeepSpeed) that is profiled", min=0)
    module_depth: int = spec(-1, "int", "deepest module level listed; -1: every level", min=-1)
    top_modules: int = spec(1, "int", "modules listed per level, most FLOPs first", min=1)
    detailed: bool = spec(True, "bool", "also print the module tree with each module's FLOPs")
    output_file: str | None = spec(None, "str", "write the profile here instead of stdout", nullable=True)
    recompute_fwd_factor: float = spec(0.0, "float", "accepted: recomputed forwards are counted as they run", min=0.0)


@dataclass(frozen=True)
class NonFiniteConfig:
    """`non_finite` (ours): what a step whose loss or gradients hold inf/NaN does, and how it is explained."""

    action: str = spec("skip", "str", "skip: skip the step and train on (DeepSpeed's behaviour); "
                       "stop: end the job with exit code 65", choices=("skip", "stop"))
    trace: bool = spec(False, "bool", "watch every module's output and output gradient on the device during the "
                       "step, so the job's first non-finite step names the first module that went inf/NaN, its "
                       "rank and micro-batch (read only at a non-finite step; off under torch.compile; off by "
                       "default: 5% of a step on an H100, docs/engine/watching.md)")
    diagnose: bool = spec(True, "bool", "with trace off (the default): at the job's first non-finite step, re-run its last "
                          "micro-batch with hooks to name the first layer whose output or gradient went non-finite")
    stuck_scale_steps: int = spec(50, "int", "fp16 without ZeRO: stop after this many overflowing steps in a row "
                                  "at min_loss_scale (ZeRO 1-3 stop at once, as DeepSpeed)", min=1)


@dataclass(frozen=True)
class DataTypesConfig:
    """`data_types`: the gradient-accumulation buffer dtype (None: the model dtype)."""

    grad_accum_dtype: str | None = spec(None, "str", "fp32, fp16 or bf16", nullable=True, choices=("fp32", "fp16", "bf16"))


@dataclass(frozen=True)
class CheckpointConfig:
    """`checkpoint`: tag validation and universal-checkpoint flags."""

    tag_validation: str = spec("Warn", "str", "Warn, Ignore or Fail when tags differ across ranks (any case)",
                               choices=("Warn", "Ignore", "Fail"), any_case=True)
    load_universal: bool = spec(False, "bool", "accepted: our checkpoints reshard directly")
    use_node_local_storage: bool = spec(False, "bool", "accepted for compatibility")
    parallel_write: dict = spec(None, "dict", "accepted for compatibility", factory=dict)


@dataclass(frozen=True)
class TorchAutocastConfig:
    """`torch_autocast`: DeepSpeed's torch.autocast mode, not built here (``enabled`` must be false)."""

    enabled: bool = spec(False, "bool", "DeepSpeed's torch.autocast mode (not built: must be false)")
    dtype: str | None = spec(None, "str", "the autocast dtype", nullable=True,
                             choices=("torch.float16", "fp16", "float16", "half", "torch.float32", "fp32", "float32",
                                      "float", "torch.bfloat16", "bf16", "bfloat16"))
    lower_precision_safe_modules: Any = spec(None, "any", "module classes whose gradients are reduced in 16 bits",
                                             nullable=True)


#: DeepSpeed 0.19.8's ``compile`` keys (DeepCompile's passes and options) with their defaults:
#: accepted at these values, anything else is refused by name (DeepCompile is not built here).
DEEPCOMPILE_DEFAULTS = {
    "deepcompile": False, "autoep_non_moe": False, "free_activation": False,
    "free_activation_threshold": 10 * 1024 * 1024, "offload_activation": False,
    "offload_activation_pin_memory": True, "offload_opt_states": False, "double_buffer": True,
    "symmetric_memory": False, "debug_log": False, "offload_parameters": False,
    "sync_before_reduce": False, "sync_after_reduce": False, "sync_before_allgather": False,
    "sync_after_allgather": False, "keep_int_input_tensors": True, "keep_all_input_tensors": False,
    "passes": None,
}


@dataclass(frozen=True)
class CompileConfig:
    """`compile`: torch.compile of the module by the engine. ``enabled``/``backend``/``kwargs`` are
    DeepSpeed's older section (0.19.8 compiles only when the script calls ``engine.compile()``,
    which works here too); 0.19.8's DeepCompile keys load at their defaults only."""

    enabled: bool = spec(False, "bool", "compile when zero.initialize returns, as engine.compile(backend, kwargs): "
                         "the whole module at stages 0-2, each repeated block (an nn.ModuleList's layers) at stage 3")
    backend: str = spec("inductor", "str", "the torch.compile backend (inductor; aot_eager or eager to check on CPU)")
    kwargs: dict = spec(None, "dict", "torch.compile's keyword arguments (mode, fullgraph, dynamic, options)",
                        factory=dict)
    deepcompile: bool = spec(False, "bool", "DeepSpeed's DeepCompile (not built: must be false)")
    autoep_non_moe: bool = spec(False, "bool", "DeepSpeed's AutoEP regional compile (not built: must be false)")
    free_activation: bool = spec(False, "bool", "DeepCompile option (not built: must be false)")
    free_activation_threshold: int = spec(10 * 1024 * 1024, "int", "DeepCompile option (not built: must stay at its default)", min=0)
    offload_activation: bool = spec(False, "bool", "DeepCompile option (not built: must be false)")
    offload_activation_pin_memory: bool = spec(True, "bool", "DeepCompile option (not built: must stay at its default)")
    offload_opt_states: bool = spec(False, "bool", "DeepCompile option (not built: must be false)")
    double_buffer: bool = spec(True, "bool", "DeepCompile option (not built: must stay at its default)")
    symmetric_memory: bool = spec(False, "bool", "DeepCompile option (not built: must be false)")
    debug_log: bool = spec(False, "bool", "DeepCompile option (not built: must be false)")
    offload_parameters: bool = spec(False, "bool", "DeepCompile option (not built: must be false)")
    sync_before_reduce: bool = spec(False, "bool", "DeepCompile option (not built: must be false)")
    sync_after_reduce: bool = spec(False, "bool", "DeepCompile option (not built: must be false)")
    sync_before_allgather: bool = spec(False, "bool", "DeepCompile option (not built: must be false)")
    sync_after_allgather: bool = spec(False, "bool", "DeepCompile option (not built: must be false)")
    keep_int_input_tensors: bool = spec(True, "bool", "DeepCompile option (not built: must stay at its default)")
    keep_all_input_tensors: bool = spec(False, "bool", "DeepCompile option (not built: must be false)")
    passes: Any = spec(None, "any", "DeepCompile passes z1, z3, autosp, autotp (not built: must be null)", nullable=True)


@dataclass(frozen=True)
class ZeroConfig:
    """The whole engine config. Batch keys stay None until resolved for a world size."""

    train_batch_size: int | None = spec(None, "int", "global batch per optimizer step", nullable=True, min=1, batch=True)
    train_micro_batch_size_per_gpu: int | None = spec(None, "int", "batch per rank per micro-step", nullable=True, min=1, batch=True)
    gradient_accumulation_steps: int | None = spec(None, "int", "micro-steps per optimizer step", nullable=True, min=1, batch=True)
    gradient_clipping: float = spec(1.0, "float", "global L2-norm clip; 0 disables", min=0.0)
    steps_per_print: int | None = spec(None, "int", "progress line every N optimizer steps; Infinity (as accelerate sets it) never prints",
                                       nullable=True, min=1, infinite=None)
    wall_clock_breakdown: bool = spec(False, "bool", "print forward/backward/step timings")
    memory_breakdown: bool = spec(False, "bool", "print memory_breakdown() with the progress line")
    dump_state: bool = spec(False, "bool", "accepted for compatibility")
    communication_data_type: str | None = spec(None, "str", "fp32, fp16 or bf16 for gradient reduction", nullable=True, choices=("fp32", "fp16", "bf16"))
    prescale_gradients: bool = spec(False, "bool", "divide by world size before the reduction")
    gradient_predivide_factor: float = spec(1.0, "float", "divide before the reduction, multiply after", min_exclusive=0.0)
    sparse_gradients: bool = spec(False, "bool", "accepted for compatibility")
    disable_allgather: bool = spec(False, "bool", "accepted for compatibility")
    zero_allow_untested_optimizer: bool = spec(False, "bool", "allow optimizers ZeRO was not tested with")
    zero_force_ds_cpu_optimizer: bool = spec(True, "bool", "offload requires our CPU Adam")
    gradient_allreduce_op: str = spec("mean", "str", "mean or sum", choices=("mean", "sum"))
    dataloader_drop_last: bool = spec(False, "bool", "drop the last incomplete batch")
    managed_gradient_accumulation: bool = spec(True, "bool", "false: every step() is an accumulation boundary")
    fp16: FP16Config = spec(None, "section", "fp16 training", section=FP16Config, factory=FP16Config)
    bf16: BF16Config = spec(None, "section", "bf16 training", section=BF16Config, factory=BF16Config, aliases=("bfloat16",))
    zero_optimization: ZeroOptimizationConfig = spec(None, "section", "ZeRO stage and buckets", section=ZeroOptimizationConfig, factory=ZeroOptimizationConfig)
    optimizer: NamedConfig | None = spec(None, "section", "optimizer by name", section=NamedConfig, nullable=True)
    scheduler: NamedConfig | None = spec(None, "section", "lr scheduler by name", section=NamedConfig, nullable=True)
    activation_checkpointing: ActivationCheckpointingConfig = spec(None, "section", "activation checkpointing", section=ActivationCheckpointingConfig, factory=ActivationCheckpointingConfig)
    csv_monitor: MonitorConfig = spec(None, "section", "CSV metrics", section=MonitorConfig, factory=MonitorConfig)
    tensorboard: MonitorConfig = spec(None, "section", "TensorBoard metrics", section=MonitorConfig, factory=MonitorConfig)
    wandb: WandbConfig = spec(None, "section", "Weights & Biases metrics", section=WandbConfig, factory=WandbConfig)
    comet: CometConfig = spec(None, "section", "Comet metrics", section=CometConfig, factory=CometConfig)
    flops_profiler: FlopsProfilerConfig = spec(None, "section", "FLOPs of one step, per module", section=FlopsProfilerConfig, factory=FlopsProfilerConfig)
    non_finite: NonFiniteConfig = spec(None, "section", "inf/NaN steps: skip or stop, and which layer", section=NonFiniteConfig, factory=NonFiniteConfig)
    data_types: DataTypesConfig = spec(None, "section", "accumulation dtype", section=DataTypesConfig, factory=DataTypesConfig)
    checkpoint: CheckpointConfig = spec(None, "section", "checkpoint options", section=CheckpointConfig, factory=CheckpointConfig)
    sparse_attention: dict | None = spec(None, "dict", "read by launcher.zero.sparse_attention", nullable=True)
    compile: CompileConfig = spec(None, "section", "torch.compile by the engine", section=CompileConfig, factory=CompileConfig)
    torch_autocast: TorchAutocastConfig = spec(None, "section", "DeepSpeed's torch.autocast mode (not built)",
                                               section=TorchAutocastConfig, factory=TorchAutocastConfig)
    sequence_parallel_size: int = spec(1, "int", "DeepSpeed-Ulysses sequence parallelism (not built: must be 1)", min=1)
    #: DeepSpeed top-level sections we accept unchanged but do not act on (name -> raw value).
    unsupported: dict = field(default_factory=dict, compare=False, metadata={"kind": "internal"})
    #: the config as given, for checkpoints (ds_config)
    raw: dict = field(default_factory=dict, compare=False, metadata={"kind": "internal"})

    @property
    def zero_stage(self) -> int:
        return self.zero_optimization.stage

    @property
    def overlap_comm(self) -> bool:
        flag = self.zero_optimization.overlap_comm
        return (self.zero_stage == 3) if flag is None else flag


#: DeepSpeed top-level sections that load unchanged but have no effect here (a warning says so).
ACCEPTED_UNSUPPORTED = (
    "amp", "elasticity", "autotuning", "compression_training", "data_efficiency",
    "curriculum_learning", "pipeline", "progressive_layer_drop", "pld", "eigenvalue", "quantize_training",
    "aio", "nebula", "comms_logger", "timers", "weight_quantization", "hybrid_engine", "tensor_parallel",
    "seq_parallel_communication_data_type",
    "use_data_before_expert_parallelism", "graph_harvesting", "monitor_config", "zero_legacy_stage1",
)
