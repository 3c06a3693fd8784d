"""``zero.initialize``: assemble config, process group, optimizer, strategy and scheduler.

Validate eagerly (the whole config before any tensor moves), build lazily (the stage's module is
imported only when the config names it).
"""
from __future__ import annotations

import os
from typing import Any

import torch

import launcher.zero.stall_beat as stall_beat   # --stall_timeout
from launcher.zero.assembly.builders import client_optimizer, client_scheduler
from launcher.zero.assembly.initialize_pipeline import initialize_pipeline
from launcher.zero.config.checks import check_optimizer_section, check_scheduler_section
from launcher.zero.config.load import load_config, named_by, no_effect_notes
from launcher.zero.distributed.context import DistContext, context_from_group, init_distributed
from launcher.zero.distributed.parallel_layout import layout_from_mpu, tensor_partition_dims
from launcher.zero.data.loader import build_dataloader
from launcher.zero.engine.monitor import Monitor, ready_line
from launcher.zero.engine.offload_advisor import start_advisor
from launcher.zero.engine.instruments import StepInstruments
from launcher.zero.engine.zero_engine import EngineParts, ZeroEngine
from launcher.zero.errors import ConfigError
from launcher.zero.experts.param_groups import configure_moe_param_groups
from launcher.zero.experts.wiring import check_param_groups, refuse_in_pipeline, set_up_experts
from launcher.zero.failure import install_from_env
from launcher.zero.optim import check_master_dtype_support, check_zero_support
from launcher.zero.optim.muon import MuonWithAdam, shards_of, tag_matrices
from launcher.zero.optim.no_optimizer import NoOptimizer
from launcher.zero.pipeline.module import PipelineModule
from launcher.zero.precision.loss_scaler import LossScaler, rules_from_config
from launcher.zero.precision.policy import precision_policy
from launcher.zero.stages.base import StrategyContext, resolve_strategy


def initialize(args=None, model: torch.nn.Module | None = None, optimizer=None, model_parameters=None,
               training_data=None, lr_scheduler=None, distributed_port=None, mpu=None, dist_init_required=None,
               collate_fn=None, config=None, config_params=None, process_group=None):
    """DeepSpeed's ``initialize``: returns ``(engine, optimizer, training_dataloader, lr_scheduler)``.

    ``optimizer`` is ``engine.optimizer``, the engine's ZeRO optimizer around the client's (as
    DeepSpeed's is): its ``step()`` is the ZeRO step on what ``engine.backward`` reduced (unscale,
    clip, the client optimizer, the model updated) without the scheduler or ``global_steps``,
    which ``engine.step()`` adds; ``param_groups`` are the client optimizer's own.

    ``config``: a dict or a JSON/YAML path (else ``config_params``, ``args.deepspeed_config``,
    or the launcher's ``DSLAUNCH_CONFIG``). ``optimizer`` / ``lr_scheduler``: objects, or
    callables receiving the parameters / the optimizer; they win over the config's sections.
    ``process_group``: run on this group instead of starting torch.distributed from the env.
    """
    environ = dict(os.environ)   # the rank's environment, read once here and passed on
    install_from_env(environ)
    if model is None:
        raise ConfigError("zero.initialize: model is required", hint="zero.initialize(model=model, config=...)")
    source = _config_source(config, config_params, args, environ.get("DSLAUNCH_CONFIG"))
    if isinstance(model, PipelineModule):
        refuse_in_pipeline(model)
        world = init_distributed(env=environ)   # the PipelineModule's group; this process's local rank, device
        return _ready_for_stall_watch(initialize_pipeline(model, optimizer, lr_scheduler, source, training_data,
                                                          collate_fn, world))
    _check_before_rendezvous(source, environ, optimizer, lr_scheduler, mpu, process_group)
    world = context_from_group(process_group) if process_group is not None else init_distributed(env=environ)
    layout = layout_from_mpu(world, mpu)   # the mpu read once: every axis's degree and group
    dist_context = layout.data             # ZeRO's axis
    cfg = load_config(source, world_size=dist_context.world_size)   # its errors name the file, as before
    layout.check_config(cfg.unsupported)
    precision = precision_policy(cfg)
    model.to(device=dist_context.device, dtype=precision.param_dtype)

    # MoE: expert groups built and handed out
    experts = set_up_experts(model, dist_context, cfg, tensor_size=layout.size("tensor"))
    layout = layout.with_parts(experts=experts.contexts,   # tensor shards named before stage 3 partitions
                               tensor_partition_dims=tensor_partition_dims(model) if mpu is not None else ())
    params = _optimizer_params(model, model_parameters, optimizer, cfg)
    # full sizes: a model built under zero.Init is partitioned already (ds_numel), others are before stage 3 runs
    param_count = sum(int(getattr(p, "ds_numel", p.numel())) for p in model.parameters())
    optimizer, handles_comm = _client_optimizer(optimizer, params, experts, cfg, dist_context)
    context = StrategyContext(config=cfg, parallel=layout, precision=precision, reduce_gradients=not handles_comm)
    strategy = resolve_strategy(cfg.zero_stage, offload=cfg.zero_optimization.offload_optimizer_active)(context)
    strategy.setup(model, optimizer)
    if isinstance(optimizer, MuonWithAdam):
        _attach_muon(optimizer, strategy, cfg.zero_stage)
    # DeepSpeed: no optimizer, no scheduler (an evaluation engine)
    scheduler = None if isinstance(optimizer, NoOptimizer) else client_scheduler(lr_scheduler, optimizer, cfg)
    scaler = LossScaler(rules_from_config(cfg.fp16, cfg.zero_stage)) if cfg.fp16.enabled else None
    monitor = _monitor(cfg, dist_context.rank)
    dataloader = _dataloader(training_data, cfg, dist_context, collate_fn)
    engine = ZeroEngine(EngineParts(module=model, optimizer=optimizer, lr_scheduler=scheduler, config=cfg,
                                    precision=precision, strategy=strategy, loss_scaler=scaler, monitor=monitor,
                                    dataloader=dataloader, instruments=StepInstruments(cfg, layout, monitor, environ),
                                    experts=experts))
    _ready_and_compiled(engine, monitor, param_count)
    return engine, engine.optimizer, dataloader, scheduler


def _client_optimizer(optimizer, params, experts, cfg, dist_context: DistContext):
    """The client optimizer (given, from a callable, or from the config's section), checked for
    the stage; and whether it does its own gradient communication (1-bit Adam: stage 0 only)."""
    if experts and optimizer is None:   # DeepSpeed splits the expert params into their own groups
        params = configure_moe_param_groups(params)
    optimizer = client_optimizer(optimizer, params, cfg, process_group=dist_context.group,
                                 offload=bool(cfg.zero_optimization.offload_optimizer_active))
    check_param_groups(experts, optimizer.param_groups)
    if not isinstance(optimizer, NoOptimizer):
        check_zero_support(optimizer, cfg.zero_stage, cfg.zero_allow_untested_optimizer)
        check_master_dtype_support(optimizer, cfg.bf16, bool(cfg.zero_optimization.offload_optimizer_active))
    handles_comm = bool(getattr(optimizer, "handles_gradient_communication", False))
    if handles_comm and cfg.zero_stage != 0:
        raise ConfigError(f"optimizer {type(optimizer).__name__} does its own gradient communication and needs "
                          f"zero_optimization.stage 0 (got {cfg.zero_stage})", hint="set zero_optimization.stage to 0")
    return optimizer, handles_comm


def _optimizer_params(model, model_parameters, optimizer, cfg) -> list:
    """What the optimizer holds: ``model_parameters``, else the model's; every parameter for an
    evaluation engine (no optimizer anywhere: DeepSpeed's DummyOptim holds them all). A config naming
    Muon tags the model's matrices first, as DeepSpeed does whenever it names Muon."""
    if cfg.optimizer is not None and cfg.optimizer.type.lower() == "muon":
        tag_matrices(model)
    if model_parameters is None or (optimizer is None and cfg.optimizer is None):
        return list(model.parameters())
    return list(model_parameters)


def _attach_muon(optimizer: MuonWithAdam, strategy, stage: int) -> None:
    """Muon learns where its matrices lie in the masters; at ZeRO 1-3 it orthogonalizes before the
    norm, so the clip scales its updates (DeepSpeed's order), at stage 0 in its step."""
    optimizer.attach_shards(shards_of(strategy))
    if stage in (1, 2, 3):
        strategy.before_norm.append(optimizer.orthogonalize_grads)


def _monitor(cfg, rank: int) -> Monitor:
    """The console and metric writers, having said which config settings load but change nothing."""
    monitor = Monitor(cfg, rank)
    for note in no_effect_notes(cfg):
        monitor.log(note)
    return monitor


def _dataloader(training_data, cfg, dist_context: DistContext, collate_fn):
    if training_data is None:
        return None
    return build_dataloader(training_data, cfg, dist_context, collate_fn)


def _say_ready(engine: ZeroEngine, monitor: Monitor, param_count: int) -> None:
    """The first line, before the first step: stage, precision, world size and bytes per rank."""
    cfg = engine.zero_config
    precision = "fp16" if cfg.fp16.enabled else "bf16" if cfg.bf16.enabled else "fp32"
    monitor.log(ready_line(cfg.zero_stage, precision, engine.dist_context.world_size, param_count,
                           engine.memory_breakdown()))
    for nvme_line in (engine.strategy.nvme_summary() or "").splitlines():   # parameters, optimizer states
        monitor.log(nvme_line)
    engine.observer.advisor = start_advisor(engine, monitor)   # offload's bound (quiet without offload)
    if precision != "fp32" and engine.dist_context.device.type == "cpu":
        monitor.log(f"{precision} on CPU: most CPUs have no fast {precision} matrix kernels, so steps can run several "
                    f"times slower than fp32; 16-bit precision pays off on a GPU")


def _ready_and_compiled(engine: ZeroEngine, monitor: Monitor, param_count: int) -> None:
    """The ready line, then the ``compile`` section: ``enabled`` compiles as
    ``engine.compile(backend, kwargs)`` would."""
    _say_ready(engine, monitor, param_count)
    section = engine.zero_config.compile
    if section.enabled:
        engine.compile(section.backend, section.kwargs)
    _ready_for_stall_watch(None)


def _ready_for_stall_watch(built):
    """--stall_timeout: the engine is ready, one event; a rank stuck from here to its first forward (a
    data loader on a hung file system) is then behind the peers that went on to wait in its all-reduce."""
    stall_beat.reached(-1)
    return built


def _check_before_rendezvous(source, environ: dict[str, str], optimizer, lr_scheduler, mpu, process_group) -> None:
    """The config parsed and checked as far as it can be without a process group.

    Before the rendezvous: a typo is then one message from every rank alike, never a rank that
    fails on the store its peer took down when it exited on the typo.

    Keys and values always; the optimizer and scheduler sections where no object replaces them;
    the batch triplet where the launcher's WORLD_SIZE is the data-parallel size (no mpu or group).
    """
    world_size = environ.get("WORLD_SIZE", "1")
    known_size = mpu is None and process_group is None and world_size.isdigit() and int(world_size) >= 1
    cfg = load_config(source, world_size=int(world_size) if known_size else None)
    with named_by(source):
        if optimizer is None and cfg.optimizer is not None:
            check_optimizer_section(cfg)
        if lr_scheduler is None and cfg.scheduler is not None:
            check_scheduler_section(cfg)


def _config_source(config, config_params, args, launcher_config: str | None) -> Any:
    from_args = getattr(args, "deepspeed_config", None) or getattr(args, "deepscale_config", None)
    given = config if config is not None else config_params
    if from_args and given is not None and given != from_args:
        raise ConfigError("zero.initialize: a config came both as config= and as args.deepspeed_config "
                          f"({from_args})", hint="pass one of them (DeepSpeed refuses both too)")
    from_script = given if given is not None else from_args
    if launcher_config and from_script not in (None, "") and not _same_file(from_script, launcher_config):
        # an ignored `dslaunch --config` would train with a config the user did not ask for
        shown = from_script if isinstance(from_script, (str, os.PathLike)) else "a dict"
        raise ConfigError(f"two configs: dslaunch --config {launcher_config} and the script's {shown}",
                          hint="drop dslaunch --config, or let the script pass config=None to use it")
    for candidate in (config, config_params, from_args, launcher_config):
        if candidate is not None and candidate != "":
            return candidate
    raise ConfigError("zero.initialize: no config given",
                      hint='pass config="ds_config.json" (or a dict), or launch with dslaunch --config PATH')


def _same_file(source, path: str) -> bool:
    if not isinstance(source, (str, os.PathLike)):
        return False
    return os.path.realpath(os.fspath(source)) == os.path.realpath(path)
