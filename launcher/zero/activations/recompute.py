"""Activation checkpointing with DeepSpeed's API (`deepspeed.checkpointing`), on torch.utils.checkpoint.

    from launcher.zero import checkpointing   # the public face of this module
    checkpointing.configure(None, deepspeed_config="ds.json")   # or keyword flags
    y = checkpointing.checkpoint(block, x)                      # recomputed in backward
    checkpointing.checkpoint_blocks(model)                      # every block, in one call

A checkpointed call keeps only its inputs; what the function saved for backward is
recomputed during backward (non-reentrant torch.utils.checkpoint, RNG state preserved so
dropout repeats). With `cpu_checkpointing` those inputs wait on the CPU. Like DeepSpeed,
nothing happens unless the model calls `checkpoint` (or `checkpoint_blocks` did it for it).
"""

import contextlib
import dataclasses
import time

import torch
import torch.utils.checkpoint

from launcher.zero.config.load import load_config
from launcher.zero.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class CheckpointingOptions:
    """The `activation_checkpointing` settings in force (DeepSpeed's key in brackets)."""

    partition_activations: bool = False  # (partition_activations) needs model parallelism; no-op at mp size 1
    contiguous_checkpointing: bool = False  # (contiguous_memory_optimization) no-op: torch's allocator
    num_checkpoints: int | None = None  # (number_checkpoints) sizes DeepSpeed's contiguous buffer
    checkpoint_in_cpu: bool = False  # (cpu_checkpointing) offload saved inputs to CPU memory
    synchronize: bool = False  # (synchronize_checkpoint_boundary) device sync around each call
    profile: bool = False  # (profile) time each checkpointed forward


_CONFIG_KEYS = {  # DeepSpeed config key -> CheckpointingOptions field
    "partition_activations": "partition_activations",
    "contiguous_memory_optimization": "contiguous_checkpointing",
    "number_checkpoints": "num_checkpoints",
    "cpu_checkpointing": "checkpoint_in_cpu",
    "synchronize_checkpoint_boundary": "synchronize",
    "profile": "profile",
}

_options: CheckpointingOptions | None = None
_profile = {"calls": 0, "forward_seconds": 0.0}


def options_from_config(deepspeed_config) -> dict:
    """The `activation_checkpointing` section of a config (dict, path or parsed) as option fields."""
    section = load_config(deepspeed_config, passed_to="checkpointing.configure").activation_checkpointing
    return {field: getattr(section, key) for key, field in _CONFIG_KEYS.items()}


def _mp_world_size(mpu) -> int:
    if mpu is None:
        return 1
    return int(mpu.get_model_parallel_world_size())


def configure(mpu_=None, deepspeed_config=None, partition_activations=None, contiguous_checkpointing=None,
              num_checkpoints=None, checkpoint_in_cpu=None, synchronize=None, profile=None):
    """Set the options `checkpoint` uses, as DeepSpeed's configure: explicit arguments win over
    the config's `activation_checkpointing` section, which wins over the defaults."""
    global _options
    fields = options_from_config(deepspeed_config) if deepspeed_config is not None else {}
    explicit = dict(partition_activations=partition_activations, contiguous_checkpointing=contiguous_checkpointing,
                    num_checkpoints=num_checkpoints, checkpoint_in_cpu=checkpoint_in_cpu,
                    synchronize=synchronize, profile=profile)
    fields.update({k: v for k, v in explicit.items() if v is not None})
    options = CheckpointingOptions(**fields)
    if options.contiguous_checkpointing and not options.partition_activations:
        raise ConfigError("activation_checkpointing.contiguous_memory_optimization needs partition_activations",
                          hint="set partition_activations to true, or contiguous_memory_optimization to false")
    if options.contiguous_checkpointing and options.num_checkpoints is None:
        raise ConfigError("activation_checkpointing.contiguous_memory_optimization needs number_checkpoints",
                          hint="set number_checkpoints to the number of checkpointed calls per forward")
    if options.partition_activations and _mp_world_size(mpu_) > 1:
        raise ConfigError("activation_checkpointing.partition_activations across model-parallel ranks "
                          "is not supported", hint="set partition_activations to false")
    _options = options


def is_configured() -> bool:
    return _options is not None


def reset() -> None:
    """Back to the unconfigured defaults and empty profile counters."""
    global _options
    _options = None
    _profile.update(calls=0, forward_seconds=0.0)


def current_options() -> CheckpointingOptions:
    return _options if _options is not None else CheckpointingOptions()


def profile_stats() -> dict:
    """With `profile`: how many checkpointed forwards ran and their total wall time."""
    return dict(_profile)


def _synchronize(tensors) -> None:
    if torch.cuda.is_available() and any(t.is_cuda for t in tensors if isinstance(t, torch.Tensor)):
        torch.cuda.synchronize()


def checkpoint(function, *args, **kwargs):
    """Run function(*args) keeping only its inputs for backward; returns its outputs."""
    if not torch.is_grad_enabled():
        return function(*args, **kwargs)
    options = current_options()
    offload = options.checkpoint_in_cpu
    if options.synchronize:
        _synchronize(args)
    started = time.perf_counter()
    saved_on_cpu = (torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available()) if offload
                    else contextlib.nullcontext())
    with saved_on_cpu:
        outputs = torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False, **kwargs)
    if options.synchronize:
        _synchronize(args)
    if options.profile:
        _profile["calls"] += 1
        _profile["forward_seconds"] += time.perf_counter() - started
    return outputs


class _CheckpointedForward:
    """Mixed in front of a block's class so its forward goes through `checkpoint`; the module,
    its parameters and its state_dict keys stay as they were."""

    def forward(self, *args, **kwargs):
        return checkpoint(super().forward, *args, **kwargs)


_checkpointed_classes: dict = {}


def _checkpointed_class(cls):
    if cls not in _checkpointed_classes:
        _checkpointed_classes[cls] = type(f"Checkpointed{cls.__name__}", (_CheckpointedForward, cls), {})
    return _checkpointed_classes[cls]


def find_blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The model's repeated blocks: the longest ModuleList inside it (GPT's `blocks`/`h`/`layers`)."""
    if isinstance(model, (torch.nn.ModuleList, torch.nn.Sequential)):
        return model
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    if not lists:
        raise ConfigError(f"checkpoint_blocks found no ModuleList of blocks in {type(model).__name__}",
                          hint="pass the ModuleList of blocks itself, e.g. checkpoint_blocks(model.layers)")
    return max(lists, key=len)


def checkpoint_blocks(model_or_blocks: torch.nn.Module) -> list:
    """Checkpoint every block of a model (or of a ModuleList/Sequential) in one call.

    Each block's forward then runs through `checkpoint`. Returns the blocks changed.
    """
    changed = []
    for block in find_blocks(model_or_blocks):
        if not isinstance(block, _CheckpointedForward):
            block.__class__ = _checkpointed_class(type(block))
            changed.append(block)
    return changed


def uncheckpoint_blocks(model_or_blocks: torch.nn.Module) -> list:
    """Undo checkpoint_blocks."""
    changed = []
    for block in find_blocks(model_or_blocks):
        if isinstance(block, _CheckpointedForward):
            block.__class__ = type(block).__mro__[2]
            changed.append(block)
    return changed


def chunked_loss(loss_sum, hidden: torch.Tensor, targets: torch.Tensor, chunks: int) -> torch.Tensor:
    """The mean token loss, computed `chunks` pieces of tokens at a time, each piece checkpointed.

    `loss_sum(hidden_piece, targets_piece)` maps (n, width) and (n,) to the summed loss of those
    n tokens, e.g. `F.cross_entropy(head(h).float(), t, reduction="sum")`. Only one piece's
    logits exist at a time, in forward and in backward (where the piece is recomputed): for a
    language model the (tokens x vocabulary) logits, their fp32 copy and their gradient are the
    largest tensors of the step and the part that checkpointing the blocks leaves alone.
    Equal to `loss_sum(all) / tokens` up to the order of the summation.
    """
    if chunks < 1:
        raise ConfigError(f"chunked_loss needs chunks >= 1, got {chunks}")
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_targets = targets.reshape(-1)
    if flat_hidden.shape[0] != flat_targets.shape[0]:
        raise ConfigError(f"chunked_loss: {flat_hidden.shape[0]} hidden rows but {flat_targets.shape[0]} targets")
    if chunks == 1 or not torch.is_grad_enabled():
        return loss_sum(flat_hidden, flat_targets) / flat_targets.numel()
    total = None
    for h, t in zip(flat_hidden.chunk(chunks), flat_targets.chunk(chunks)):
        piece = checkpoint(loss_sum, h, t)
        total = piece if total is None else total + piece
    return total / flat_targets.numel()
