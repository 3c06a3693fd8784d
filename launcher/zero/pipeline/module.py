"""``PipelineModule``: a layer list of which each rank builds only its own stage's part.

``LayerSpec(cls, *args, **kwargs)`` defers building a layer until its owning stage is known;
``TiedLayerSpec(key, cls, ...)`` builds one module per stage per key and the engine keeps the
copies on different stages equal (their gradients summed across the tie). Non-tied layers are
children named by their global index, so a stage's ``state_dict()`` keys read ``<index>.<param>``
as in ``nn.Sequential``; tied modules live under ``tied_modules.<key>``.

``num_virtual_stages=V`` (our extension; DeepSpeed has no interleaving) splits the layers into
``num_stages x V`` chunks, and stage s holds chunks ``s, s + P, s + 2P, ...`` (Megatron's and
``torch.distributed.pipelining``'s layout), run by the ``interleaved`` schedule. ``parts`` then has
``P x V + 1`` boundaries, one part per virtual stage.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

from launcher.zero.distributed.context import init_distributed
from launcher.zero.errors import ConfigError
from launcher.zero.parallel.topology import PipeDataParallelTopology, ProcessTopology
from launcher.zero.pipeline.layer_split import partition_layers


class LayerSpec:
    """A layer to build later: ``LayerSpec(nn.Linear, 8, 16)`` builds ``nn.Linear(8, 16)``."""

    def __init__(self, typename: type, *module_args: Any, **module_kwargs: Any):
        if not isinstance(typename, type) or not issubclass(typename, nn.Module):
            raise ConfigError(f"LayerSpec: {typename!r} is not an nn.Module class",
                              hint="LayerSpec(nn.Linear, 8, 16): the class, then its arguments")
        self.typename = typename
        self.module_args = module_args
        self.module_kwargs = module_kwargs

    def build(self) -> nn.Module:
        return self.typename(*self.module_args, **self.module_kwargs)

    def __repr__(self) -> str:
        return f"LayerSpec({self.typename.__name__})"


class TiedLayerSpec(LayerSpec):
    """A layer whose ``tied_weight_attr`` is shared with every other spec of the same ``key``."""

    def __init__(self, key: str, typename: type, *module_args: Any, forward_fn: Callable | None = None,
                 tied_weight_attr: str | list[str] = "weight", **module_kwargs: Any):
        super().__init__(typename, *module_args, **module_kwargs)
        self.key = key
        self.forward_fn = forward_fn
        self.tied_weight_attr = [tied_weight_attr] if isinstance(tied_weight_attr, str) else list(tied_weight_attr)


def _type_name(layer: Any) -> str:
    if isinstance(layer, LayerSpec):
        return layer.typename.__name__
    return type(layer).__name__ if isinstance(layer, nn.Module) else getattr(layer, "__name__", type(layer).__name__)


def _param_count(layer: Any) -> int:
    """Trainable parameters of a layer; specs are built on the meta device (no memory)."""
    if isinstance(layer, LayerSpec):
        with torch.device("meta"):
            layer = layer.build()
    if isinstance(layer, nn.Module):
        return sum(p.numel() for p in layer.parameters() if p.requires_grad)
    return 0


class PipelineModule(nn.Module):
    """DeepSpeed's ``PipelineModule``: ``layers`` split over ``num_stages`` (or ``topology``'s pipe axis)."""

    def __init__(self, layers, num_stages: int | None = None, topology: ProcessTopology | None = None,
                 loss_fn: Callable | None = None, seed_layers: bool = False, seed_fn=None, base_seed: int = 1234,
                 partition_method: str = "parameters", activation_checkpoint_interval: int = 0,
                 activation_checkpoint_func: Callable = checkpoint, checkpointable_layers=None,
                 num_virtual_stages: int = 1):
        super().__init__()
        self._layer_specs = list(layers)
        if not self._layer_specs:
            raise ConfigError("PipelineModule: layers is empty", hint="pass the model as a list of LayerSpec / modules")
        if not dist.is_initialized():
            init_distributed()
        world_size, self.global_rank = dist.get_world_size(), dist.get_rank()
        # a ParallelGrid may stand for its topology, so that layers built with its tensor group share its groups
        self._grid = topology if hasattr(topology, "get_model_parallel_group") else None
        topology = self._grid.topology() if self._grid is not None else topology
        self._topo = self._resolve_topology(num_stages, topology, world_size)
        self.num_stages = self._topo.get_dim("pipe")
        self.stage_id = self._topo.get_coord(self.global_rank).pipe
        self.loss_fn = loss_fn
        self.partition_method = partition_method
        self.activation_checkpoint_interval = int(activation_checkpoint_interval)
        self.activation_checkpoint_func = activation_checkpoint_func
        self.seed_layers, self.base_seed = seed_layers, base_seed
        if not isinstance(num_virtual_stages, int) or num_virtual_stages < 1:
            raise ConfigError(f"PipelineModule: num_virtual_stages={num_virtual_stages!r}; expected an int >= 1",
                              hint="num_virtual_stages=2 interleaves two chunks of layers per stage")
        self.num_virtual_stages = num_virtual_stages
        self.parts = partition_layers(partition_method, self.num_stages * num_virtual_stages,
                                      [_param_count(layer) for layer in self._layer_specs],
                                      [_type_name(layer) for layer in self._layer_specs])
        self.tied_modules = nn.ModuleDict()
        self.tied_weight_attrs: dict[str, list[str]] = {}
        self.forward_funcs: list[Callable] = []
        self.chunk_funcs: list[list[Callable]] = [[] for _ in range(num_virtual_stages)]
        self._build()

    @staticmethod
    def _resolve_topology(num_stages, topology, world_size: int) -> ProcessTopology:
        if topology is not None:
            if topology.world_size() != world_size:
                raise ConfigError(f"PipelineModule: the topology has {topology.world_size()} ranks, the world "
                                  f"{world_size}", hint="build the topology for the launched world size")
            return topology
        if num_stages is None or num_stages < 1:
            raise ConfigError("PipelineModule: give num_stages (>= 1) or topology", hint="num_stages=2")
        if world_size % num_stages:
            raise ConfigError(f"PipelineModule: num_stages={num_stages} does not divide the world of "
                              f"{world_size} ranks", hint="launch a multiple of num_stages ranks")
        return PipeDataParallelTopology(num_pp=num_stages, num_dp=world_size // num_stages)

    def chunk_layers(self, stage_id: int, chunk: int) -> range:
        """The global indices of chunk ``chunk`` (virtual stage ``chunk x P + stage_id``) of a stage."""
        virtual = chunk * self.num_stages + stage_id
        return range(self.parts[virtual], self.parts[virtual + 1])

    def stage_layers(self, stage_id: int) -> list[int]:
        """The global indices of the layers stage ``stage_id`` owns, over all its chunks."""
        return [index for chunk in range(self.num_virtual_stages) for index in self.chunk_layers(stage_id, chunk)]

    def _build(self) -> None:
        for chunk in range(self.num_virtual_stages):
            for index in self.chunk_layers(self.stage_id, chunk):
                self.chunk_funcs[chunk].append(self._build_layer(index))
        self.forward_funcs = [func for funcs in self.chunk_funcs for func in funcs]

    def _build_layer(self, index: int) -> Callable:
        """Build layer ``index`` (registered as a child named by it) and return what its forward calls."""
        layer = self._layer_specs[index]
        if self.seed_layers:
            torch.manual_seed(self.base_seed + index)
        if isinstance(layer, TiedLayerSpec):
            if layer.key not in self.tied_modules:
                self.tied_modules[layer.key] = layer.build()
                self.tied_weight_attrs[layer.key] = layer.tied_weight_attr
            return _tied_forward(self.tied_modules[layer.key], layer.forward_fn)
        if isinstance(layer, LayerSpec):
            layer = layer.build()
        if isinstance(layer, nn.Module):
            self.add_module(str(index), layer)
            return layer
        if callable(layer):
            return layer
        raise ConfigError(f"PipelineModule: layer {index} ({layer!r}) is neither a LayerSpec, a module nor "
                          "a callable", hint=None)

    def tied_stages(self) -> dict[str, list[int]]:
        """For every tie key, the stages holding a copy (the same answer on every rank)."""
        stages: dict[str, list[int]] = {}
        for stage in range(self.num_stages):
            for index in self.stage_layers(stage):
                layer = self._layer_specs[index]
                if isinstance(layer, TiedLayerSpec) and stage not in stages.setdefault(layer.key, []):
                    stages[layer.key].append(stage)
        return stages

    def forward(self, x, chunk: int | None = None):
        """This stage's layers (or one chunk's) in order; every ``activation_checkpoint_interval`` layers
        are checkpointed."""
        interval = self.activation_checkpoint_interval
        funcs = self.forward_funcs if chunk is None else self.chunk_funcs[chunk]
        if interval <= 0 or not torch.is_grad_enabled():
            for func in funcs:
                x = func(x)
            return x
        for start in range(0, len(funcs), interval):
            chunk = funcs[start:start + interval]
            if self.activation_checkpoint_func is checkpoint:
                x = checkpoint(_run_chunk(chunk), x, use_reentrant=False)
            else:   # e.g. zero.checkpointing.checkpoint, DeepSpeed's signature fn(function, *args)
                x = self.activation_checkpoint_func(_run_chunk(chunk), x)
        return x

    def topology(self) -> ProcessTopology:
        return self._topo

    def grid(self):
        """The ParallelGrid passed as ``topology`` (None: the engine builds one)."""
        return self._grid


def _tied_forward(module: nn.Module, forward_fn: Callable | None) -> Callable:
    if forward_fn is None:
        return module
    return lambda x: forward_fn(module, x)


def _run_chunk(funcs: list[Callable]) -> Callable:
    def run(x):
        for func in funcs:
            x = func(x)
        return x
    return run
