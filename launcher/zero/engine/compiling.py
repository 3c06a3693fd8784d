"""torch.compile for the engine's module: what ``engine.compile()`` and the ``compile`` config do.

Where the compiled code runs, a Python hook would be traced into the graph or break it. Stage 3
gathers and releases parameters in module hooks, so there the module is compiled per *region*:
each repeated block (the children of a ``ModuleList`` of same-class modules, torchtitan's
transformer blocks) gets a compiled ``forward``, and the strategy gathers each block's parameters
as one unit in hooks around it, outside the compiled code. Identical blocks share one graph.
Stages 0-2 put no hooks in the forward, so the whole module's ``forward`` is compiled, as
DeepSpeed's ``engine.compile()`` does.

Only ``forward`` is replaced (an instance attribute; the class is untouched), so parameter names,
``state_dict`` keys and checkpoints stay as they were, and ``undo`` restores the module.

Glossary: a *region* is a module whose ``forward`` runs compiled; a *graph break* is a place
where dynamo stopped a graph and fell back to Python (counted by dynamo, read by ``compile_stats``).

Wiring into the engine (issue 32 phase 2, once engine.py and the config have moved):

* config: ``compile: {"enabled": bool, "backend": str = "inductor", "kwargs": dict}`` (DeepSpeed's
  older section; 0.19.8's ``deepcompile``/``passes`` keys raise NotSupportedError naming them);
* ``Engine.compile(self, backend="inductor", compile_kwargs=None)``: ``self._compiled =
  compile_for_strategy(self.module, self.strategy, CompileSettings(backend, dict(compile_kwargs or {})))``,
  a second call with ``self._compiled`` set returns at once (as DeepSpeed's);
* ``Engine.is_compiled``: ``self._compiled is not None``; ``initialize`` calls ``engine.compile(
  config.compile.backend, config.compile.kwargs)`` when ``compile.enabled``; ``destroy`` calls
  ``self._compiled.undo()`` before the strategy's.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from launcher.zero.errors import NotSupportedError


@dataclasses.dataclass(frozen=True)
class CompileSettings:
    """DeepSpeed's ``compile`` section (``{"enabled", "backend", "kwargs"}``) and the arguments of
    ``engine.compile(backend=, compile_kwargs=)``."""

    backend: str = "inductor"
    kwargs: dict = dataclasses.field(default_factory=dict)   # passed to torch.compile as they are
    #: "auto": blocks at stage 3 (and wherever the module holds hooks), else the whole module;
    #: "blocks" or "module" to choose
    scope: str = "auto"


def repeated_blocks(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The children of every ``nn.ModuleList`` of at least two modules of one class (a transformer's
    layers), outermost lists first; a list inside a block already found is not searched."""
    found: list[torch.nn.Module] = []
    inside: set[int] = set()
    for child in module.modules():
        if id(child) in inside or not isinstance(child, torch.nn.ModuleList) or len(child) < 2:
            continue
        kinds = {type(item) for item in child}
        if len(kinds) != 1:
            continue
        for block in child:
            found.append(block)
            inside.update(id(m) for m in block.modules())
    return found


def hooked_modules(module: torch.nn.Module, skip: torch.nn.Module | None = None) -> list[torch.nn.Module]:
    """Modules of ``module``'s tree (``skip`` itself excepted) with forward hooks: compiled code
    around them would trace or break on them."""
    return [m for m in module.modules()
            if m is not skip and (m._forward_pre_hooks or m._forward_hooks)]


def compile_stats() -> dict[str, Any]:
    """What dynamo counted in this process: graphs, graph breaks (with their reasons), recompiles."""
    from torch._dynamo.utils import counters

    breaks = dict(counters["graph_break"])
    return {"unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
            "graph_breaks": int(sum(breaks.values())),
            "graph_break_reasons": {str(k)[:200]: int(v) for k, v in list(breaks.items())[:10]},
            "recompiles": int(sum(counters["recompiles"].values())) if "recompiles" in counters else 0}


class Compiled:
    """The regions one ``compile_regions`` call compiled, and how to undo it."""

    def __init__(self, regions: list[torch.nn.Module], scope: str, settings: CompileSettings):
        self.regions, self.scope, self.settings = regions, scope, settings

    def undo(self) -> None:
        """Give every region its own ``forward`` back (engine.destroy)."""
        for region in self.regions:
            region.__dict__.pop("forward", None)
        self.regions = []


def choose_scope(module: torch.nn.Module, settings: CompileSettings, blocks_needed: bool) -> str:
    """"blocks" or "module" for this module: blocks where the strategy gathers per block or the
    module holds hooks a whole-module graph would trace."""
    if settings.scope in ("blocks", "module"):
        return settings.scope
    if settings.scope != "auto":
        raise NotSupportedError(f"compile scope {settings.scope!r}", hint='use "auto", "blocks" or "module"')
    return "blocks" if blocks_needed or hooked_modules(module, skip=module) else "module"


def compile_regions(module: torch.nn.Module, settings: CompileSettings, blocks_needed: bool = False,
                    before_compile=None) -> Compiled:
    """Compile ``module``'s forward, or each repeated block's (see the module docstring).

    ``before_compile(blocks)`` lets the strategy take the blocks as units first (stage 3's
    coordinator); a hook left *inside* a block would be traced, so that is refused, naming it."""
    scope = choose_scope(module, settings, blocks_needed)
    if scope == "module":
        regions = [module]
    else:
        regions = repeated_blocks(module)
        if not regions:
            raise NotSupportedError(
                f"compile: {type(module).__name__} has no repeated blocks (an nn.ModuleList of same-class "
                "modules) to compile one by one, which stage 3 and hooked modules need",
                hint="hold the transformer layers in an nn.ModuleList, or compile at stage 0-2")
        if before_compile is not None:
            before_compile(regions)
        for block in regions:
            hooked = hooked_modules(block, skip=block)
            if hooked:
                raise NotSupportedError(
                    f"compile: {type(hooked[0]).__name__} inside {type(block).__name__} has forward hooks, "
                    "which compiled code would trace",
                    hint="turn off what registers them (offload_optimizer.overlap_step does) or compile without it")
    for region in regions:
        if "forward" in region.__dict__:
            raise NotSupportedError(f"compile: {type(region).__name__}.forward is already replaced "
                                    "(compiled twice, or patched by another library)",
                                    hint="call engine.compile() once")
        region.forward = torch.compile(region.forward, backend=settings.backend, **settings.kwargs)
    return Compiled(regions, scope, settings)


def compile_for_strategy(module: torch.nn.Module, strategy, settings: CompileSettings) -> Compiled:
    """``engine.compile()``'s work: per block where the strategy gathers parameters in hooks
    (it then takes the blocks as units, ``strategy.compile_units``), else as ``settings`` say."""
    units = getattr(strategy, "compile_units", None)
    return compile_regions(module, settings, blocks_needed=units is not None, before_compile=units)
