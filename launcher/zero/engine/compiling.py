"""torch.compile for the engine's module: what ``engine.compile()`` and the ``compile`` config do.

Where the compiled code runs, a Python hook would be traced into the graph or break it, and a graph
reads its parameters when it starts. Stage 3 gathers and releases parameters in module hooks, so
there (scope "blocks_and_top") the module is compiled per *region*:

- each repeated block (the children of a ``ModuleList`` of same-class modules, torchtitan's
  transformer blocks) gets a compiled ``forward``; the strategy gathers each block's parameters as
  one unit in hooks around it (``strategy.compile_units``), outside the compiled code. Identical
  blocks share one graph;
- the top-level module's ``forward`` is compiled too: what is outside the blocks (embeddings,
  final norm, LM head) is one more unit, gathered by the module's own hooks, which run before its
  compiled ``forward`` is entered, and released after it. The loss a model computes in its forward
  (HF models with ``labels``, the bench GPT) is then in a graph, not eager ops over the logits;
- the blocks' hooks are under ``torch.compiler.disable`` (as DeepSpeed's ``engine.compile`` keeps
  its ZeRO-3 hooks out), so the top's graph breaks at each block call, and only there; the block
  then runs its hooks and its own compiled forward. The saved-tensor hooks are disabled too (eager
  code that compiled code calls would otherwise have them compiled as frames of their own).

Dynamo cannot break a graph inside a loop: a frame that calls the blocks in a ``for`` loop is
skipped whole (its own lines run eagerly, the functions it calls compile as frames of their own:
the bench GPT's ``token_loss_sum``, a HF model's inner ``LlamaModel.forward``'s callees and the outer
forward's head and loss after the inner call). ``compile_stats`` counts graphs, breaks (each once,
when traced) and the skipped frames, so the report says which case a model is in. A hook on a
module outside the blocks (not ours) keeps the top eager (scope "blocks"). Stages 0-2 put no hooks
in the forward, so the whole module's ``forward`` is compiled, as DeepSpeed's ``engine.compile()``
does. Memory at stage 3: the blocks' parameters are gathered and released per block as in eager;
those outside the blocks stay gathered for the whole forward (docs/engine/zero.md).

Only ``forward`` is replaced (an instance attribute; the class is untouched), so parameter names,
``state_dict`` keys and checkpoints stay as they were, and ``undo`` restores the module.

Glossary: a *region* is a module whose ``forward`` runs compiled; a *unit* is a module whose
parameters stage 3 gathers as one; a *graph break* is a place where dynamo stopped a graph and fell
back to Python (counted by dynamo, read by ``compile_stats``); a *skipped frame* is a function dynamo
ran eagerly as a whole.

In the engine: the ``compile`` config section (``enabled``, ``backend``, ``kwargs``) makes
``zero.initialize`` call ``engine.compile(backend, kwargs)``; ``engine.compile`` calls
``compile_engine`` once (a second call returns, as DeepSpeed's), ``engine.is_compiled`` says whether
it did, and ``engine.destroy`` undoes it. What compiled code cannot keep is refused by name
(``refusals``): ``offload_optimizer.overlap_step`` waits per module in forward hooks.
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
    #: "auto": "blocks_and_top" where the strategy gathers per block (stage 3), "blocks" wherever
    #: else the module holds hooks, else "module"; or one of them to choose ("blocks": the blocks
    #: alone, the code around them eager)
    scope: str = "auto"


SCOPES = ("auto", "module", "blocks", "blocks_and_top")


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
    """What dynamo counted in this process: graphs, graph breaks (with their reasons), recompiles,
    and frames it compiled or skipped (a frame that breaks inside a loop is skipped whole: its own
    lines run eagerly, the functions it calls are compiled as frames of their own)."""
    from torch._dynamo.utils import counters

    breaks = dict(counters["graph_break"])
    frames = counters["frames"]
    compiled = int(frames.get("ok", 0))
    return {"unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
            "graph_breaks": int(sum(breaks.values())),
            "graph_break_reasons": {str(k)[:200]: int(v) for k, v in list(breaks.items())[:10]},
            "recompiles": int(sum(counters["recompiles"].values())) if "recompiles" in counters else 0,
            "frames_compiled": compiled, "frames_skipped": int(frames.get("total", 0)) - compiled,
            "frame_skip_reasons": _skip_reasons(counters["unimplemented"])}


def _skip_reasons(unimplemented) -> list[str]:
    """The ``Developer debug context: frame skipped: ...`` lines dynamo left (which frame, where)."""
    found = []
    for text in unimplemented:
        for line in str(text).splitlines():
            if "frame skipped:" in line:
                reason = line.split("frame skipped:", 1)[1].strip()[:200]
                if reason not in found:
                    found.append(reason)
    return found[:10]


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
    """The scope for this module (``CompileSettings.scope``): blocks and the top where the strategy
    gathers per block, blocks where the module holds hooks a whole-module graph would trace."""
    if settings.scope not in SCOPES:
        raise NotSupportedError(f"compile scope {settings.scope!r}", hint="use one of " + ", ".join(SCOPES))
    if settings.scope != "auto":
        return settings.scope
    if blocks_needed:
        return "blocks_and_top"
    return "blocks" if hooked_modules(module, skip=module) else "module"


def compile_regions(module: torch.nn.Module, settings: CompileSettings, blocks_needed: bool = False,
                    before_compile=None) -> Compiled:
    """Compile ``module``'s forward, or each repeated block's (and the top's: see the module docstring).

    ``before_compile(blocks, rest)`` lets the strategy take the blocks (and, ``rest``, what is
    outside them) as units first (stage 3's coordinator); a hook left *inside* a block would be
    traced, so that is refused, naming it. A hook outside the blocks keeps the top eager."""
    scope = choose_scope(module, settings, blocks_needed)
    if scope == "module":
        regions = [module]
    else:
        regions = _blocks_of(module)
        if before_compile is not None:
            before_compile(regions, scope == "blocks_and_top")
        for block in regions:
            hooked = hooked_modules(block, skip=block)
            if hooked:
                raise NotSupportedError(
                    f"compile: {type(hooked[0]).__name__} inside {type(block).__name__} has forward hooks, "
                    "which compiled code would trace",
                    hint="turn off what registers them (offload_optimizer.overlap_step does) or compile without it")
        if scope == "blocks_and_top":
            if _hooked_outside(module, regions):   # someone else's hooks: the top stays eager
                scope = "blocks"
                if before_compile is not None:
                    before_compile(regions, False)
            else:
                regions = regions + [module]
    for region in regions:
        if "forward" in region.__dict__:
            raise NotSupportedError(f"compile: {type(region).__name__}.forward is already replaced "
                                    "(compiled twice, or patched by another library)",
                                    hint="call engine.compile() once")
        region.forward = torch.compile(region.forward, backend=settings.backend, **settings.kwargs)
    return Compiled(regions, scope, settings)


def _blocks_of(module: torch.nn.Module) -> list[torch.nn.Module]:
    blocks = repeated_blocks(module)
    if not blocks:
        raise NotSupportedError(
            f"compile: {type(module).__name__} has no repeated blocks (an nn.ModuleList of same-class "
            "modules) to compile one by one, which stage 3 and hooked modules need",
            hint="hold the transformer layers in an nn.ModuleList, or compile at stage 0-2")
    return blocks


def _hooked_outside(module: torch.nn.Module, blocks: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """Modules with forward hooks between the top and the blocks (the top's and the blocks' own
    hooks run outside the compiled code, so they do not count)."""
    inside = {id(m) for block in blocks for m in block.modules()}
    return [m for m in hooked_modules(module, skip=module) if id(m) not in inside]


def compile_for_strategy(module: torch.nn.Module, strategy, settings: CompileSettings) -> Compiled:
    """``engine.compile()``'s work: per block where the strategy gathers parameters in hooks
    (it then takes the blocks as units, ``strategy.compile_units``), else as ``settings`` say."""
    units = strategy.compile_units
    return compile_regions(module, settings, blocks_needed=units is not None, before_compile=units)


def refusals(config, schedule=None, compiled_autograd_enabled: bool = False) -> list[str]:
    """What of this config and these arguments compiled code cannot keep, by name (empty: none)."""
    found = []
    offload = config.zero_optimization.offload_optimizer
    if offload is not None and offload.active and offload.overlap_step:
        found.append("zero_optimization.offload_optimizer.overlap_step (it waits for each module's updated "
                     "weights in forward hooks, which compiled code would trace)")
    if schedule is not None:
        found.append("engine.compile(schedule=...) (DeepCompile's schedules)")
    if compiled_autograd_enabled:
        found.append("engine.compile(compiled_autograd_enabled=True) (compiled autograd)")
    return found


def describe(compiled: Compiled) -> str:
    """What was compiled, in words (the engine's log line)."""
    if compiled.scope == "module":
        return "the whole module compiled"
    blocks = len(compiled.regions) - (compiled.scope == "blocks_and_top")
    top = (", and the module's forward around them (its graphs break at block calls; a loop over "
           "the blocks runs eagerly: compile_stats)"
           if compiled.scope == "blocks_and_top" else "")
    return f"{blocks} blocks compiled{top}"


def compile_engine(engine, backend: str = "inductor", compile_kwargs: dict | None = None, schedule=None,
                   compiled_autograd_enabled: bool = False) -> Compiled:
    """``engine.compile()``'s work: refuse what compiled code cannot keep, then compile per the
    strategy (``compile_for_strategy``). A ``backend`` inside ``compile_kwargs`` gives way to the
    ``backend`` argument, with a line saying so (DeepSpeed's rule)."""
    refused = refusals(engine.zero_config, schedule, compiled_autograd_enabled)
    if refused:
        raise NotSupportedError("compile with " + "; ".join(refused) + " is not supported",
                                hint="turn it off, or train without compile")
    kwargs = dict(compile_kwargs or {})
    if "backend" in kwargs:
        engine.monitor.log(f"compile: compile_kwargs backend {kwargs.pop('backend')!r} is overridden by "
                           f"backend={backend!r}")
    compiled = compile_for_strategy(engine.module, engine.strategy, CompileSettings(backend, kwargs))
    engine.monitor.log(f"compile: backend {backend}, {describe(compiled)}")
    return compiled
