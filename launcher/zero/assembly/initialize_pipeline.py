"""``zero.initialize`` for a ``PipelineModule``: config over the data axis, optimizer of this stage, engine.

The batch triplet is resolved against the data-parallel size (``train_batch_size = micro batch x
gradient_accumulation_steps x data-parallel ranks``), as DeepSpeed does for pipelines.
"""
from __future__ import annotations

import torch

from launcher.zero.assembly.builders import client_optimizer, client_scheduler
from launcher.zero.config.load import load_config
from launcher.zero.distributed.context import DistContext
from launcher.zero.distributed.parallel_layout import check_autotp_size, layout_from_mpu
from launcher.zero.data.loader import EngineDataLoader, EngineSampler, RepeatingLoader
from launcher.zero.errors import ConfigError, NotSupportedError
from launcher.zero.parallel.grid import ParallelGrid
from launcher.zero.pipeline.engine import PipelineEngine
from launcher.zero.pipeline.module import PipelineModule
from launcher.zero.pipeline.schedule import SCHEDULES, build_schedule
from launcher.zero.pipeline.shard import GradHolder, OptimizerShard, check_shardable
from launcher.zero.precision.loss_scaler import LossScaler, rules_from_config
from launcher.zero.precision.policy import precision_policy
from launcher.zero.stages.base import StrategyContext


def initialize_pipeline(module: PipelineModule, optimizer, lr_scheduler, source, training_data, collate_fn,
                        world: DistContext):
    """Returns ``(engine, optimizer, dataloader, lr_scheduler)`` like ``zero.initialize``; ``world``: the
    whole job's context (its local rank and device are this process's)."""
    topo = module.topology()
    data_parallel_size = max(1, topo.get_dim("data"))
    cfg = load_config(source, world_size=data_parallel_size)
    _check_supported(cfg)
    check_autotp_size(cfg.unsupported, max(1, topo.get_dim("model")))   # before any group is made
    schedule = _schedule_name(cfg, module.num_virtual_stages)
    _apply_checkpoint_keys(cfg.unsupported.get("pipeline") or {}, module)
    # validate eagerly: a bad schedule / micro-batch count is a ConfigError here, not a hang in train_batch
    build_schedule(schedule, cfg.gradient_accumulation_steps, module.num_stages, module.stage_id,
                   module.num_virtual_stages)
    stages = (cfg.unsupported.get("pipeline") or {}).get("stages", "auto")
    if stages not in ("auto", None) and stages != module.num_stages:
        raise ConfigError(f"pipeline.stages is {stages} but the PipelineModule has {module.num_stages} stages",
                          hint='make them agree, or set "stages": "auto"')
    device = world.device
    precision = precision_policy(cfg)
    module.to(device=device, dtype=precision.param_dtype)
    params = [p for p in module.parameters() if p.requires_grad]
    grid = module.grid() if module.grid() is not None else ParallelGrid(topo)
    # the grid read once: its data axis is what ZeRO-1 shards over and what dp_world_size / local_rank /
    # device answer; its tensor and pipe axes are the norm's
    layout = layout_from_mpu(world, grid)
    masters = grad_holders = None
    if precision.param_dtype != torch.float32 and cfg.zero_stage == 1:
        # fp16 / bf16 at stage 1: the fp32 master is this data rank's slice alone (the shard's), the
        # stage's gradients are kept in fp32 beside the 16-bit parameters
        grad_holders = [GradHolder() for _ in params]
    elif precision.param_dtype != torch.float32:     # fp16 / bf16: the optimizer steps fp32 copies
        masters = [torch.nn.Parameter(p.detach().float().clone()) for p in params]
    stepped = masters if masters is not None else params
    shard = None
    if cfg.zero_stage == 1:     # the optimizer steps this data rank's partition of the stage (pipeline/shard.py)
        if isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError("zero_optimization.stage 1 with pipeline parallelism builds the optimizer over this "
                              "data rank's slice, so it cannot take an optimizer already built",
                              hint="pass a callable (params -> optimizer) or an 'optimizer' config section")
        if cfg.optimizer is not None and not callable(optimizer):
            check_shardable(cfg.optimizer)
        shard = OptimizerShard(stepped, StrategyContext(config=cfg, parallel=layout, precision=precision))
        stepped = [shard.param]
    if not stepped:
        # a stage of parameter-free layers (Tanh, reshapes) still steps a scheduler; torch.optim wants a parameter
        stepped = [torch.nn.Parameter(torch.zeros(0, device=device))]
    optimizer = client_optimizer(optimizer, stepped, cfg)
    scheduler = client_scheduler(lr_scheduler, optimizer, cfg)
    scaler = LossScaler(rules_from_config(cfg.fp16, 0)) if cfg.fp16.enabled else None
    engine = PipelineEngine(module, optimizer, scheduler, cfg, layout, grid, schedule=schedule, masters=masters,
                            grad_holders=grad_holders, loss_scaler=scaler, shard=shard)
    dataloader = _dataloader(engine, training_data, cfg, collate_fn) if training_data is not None else None
    return engine, optimizer, dataloader, scheduler


def _dataloader(engine: PipelineEngine, training_data, cfg, collate_fn):
    """DeepSpeed's pipeline loader: the data ranks' DistributedSampler shares without shuffling, repeated
    forever; the loader returned is the one the engine draws from (as DeepSpeed's is)."""
    sampler = EngineSampler(training_data, engine.dp_world_size, engine.grid.get_data_parallel_rank(), shuffle=False)
    dataloader = RepeatingLoader(EngineDataLoader(training_data, cfg.train_micro_batch_size_per_gpu, sampler,
                                                  engine.dp_world_size, collate_fn=collate_fn,
                                                  drop_last=cfg.dataloader_drop_last))
    engine.set_dataiterator(dataloader)
    return dataloader


def _check_supported(cfg) -> None:
    if cfg.compile.enabled:
        raise NotSupportedError("compile.enabled with pipeline parallelism is not supported",
                                hint="remove the compile section (the pipeline engine runs its stages eagerly)")
    if cfg.optimizer is not None and cfg.optimizer.type.lower() == "muon":
        # Muon orthogonalizes whole matrices; the pipeline engine's optimizer (and its stage 1 shard)
        # sees flat slices and no matrix tags, so it is refused here rather than failing when built
        raise ConfigError(f"optimizer.type '{cfg.optimizer.type}' with pipeline parallelism (a PipelineModule) "
                          "is not built in this engine", hint='use "AdamW" for a pipeline, or train the model '
                                                            "without PipelineModule to use Muon")
    if cfg.zero_stage > 1:
        raise ConfigError(f"zero_optimization.stage {cfg.zero_stage} with pipeline parallelism is not supported "
                          "(pipelines run ZeRO stages 0-1 over the data axis, DeepSpeed's limit too)",
                          hint='set "zero_optimization": {"stage": 1}')
    if cfg.zero_optimization.offload_optimizer_active:
        raise ConfigError("zero_optimization.offload_optimizer with pipeline parallelism is not supported",
                          hint="remove offload_optimizer (stage 1 alone partitions the optimizer state)")
    if cfg.bf16.bf16_master_weights_and_grads:
        raise NotSupportedError("bf16.bf16_master_weights_and_grads with pipeline parallelism is not supported "
                                "(the pipeline engine keeps fp32 masters)",
                                hint="remove bf16_master_weights_and_grads and bf16_optimizer_states")


def _schedule_name(cfg, num_virtual_stages: int) -> str:
    """``pipeline.schedule``; a module with virtual stages defaults to ``interleaved``, others to ``1f1b``."""
    section = cfg.unsupported.get("pipeline") or {}
    if not isinstance(section, dict):
        raise ConfigError("pipeline: expected an object", hint='"pipeline": {"schedule": "1f1b"}')
    unknown = set(section) - {"schedule", "stages", "partition", "seed_layers", "activation_checkpoint_interval",
                              "pipe_partitioned", "grad_partitioned", "use_reentrant"}
    if unknown:
        raise ConfigError(f"pipeline.{sorted(unknown)[0]}: unknown key", hint=f"pipeline.schedule is one of {SCHEDULES}")
    return str(section.get("schedule", "interleaved" if num_virtual_stages > 1 else "1f1b"))


def _apply_checkpoint_keys(section: dict, module: PipelineModule) -> None:
    """DeepSpeed's ``pipeline.activation_checkpoint_interval`` (above 0 it replaces the module's own) and
    ``pipeline.use_reentrant`` (which checkpoint function recomputes: both give the same gradients,
    and this engine's is always the non-reentrant one, so only its type is checked)."""
    reentrant = section.get("use_reentrant")
    if reentrant is not None and not isinstance(reentrant, bool):
        raise ConfigError(f"pipeline.use_reentrant: expected true or false, got {reentrant!r}",
                          hint='"use_reentrant": false')
    interval = section.get("activation_checkpoint_interval", 0)
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 0:
        raise ConfigError(f"pipeline.activation_checkpoint_interval: expected a whole number >= 0, got {interval!r}",
                          hint='"activation_checkpoint_interval": 1 checkpoints every layer')
    if interval > 0:
        module.activation_checkpoint_interval = interval
