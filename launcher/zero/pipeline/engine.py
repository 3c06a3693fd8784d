"""The pipeline engine: one ``train_batch`` runs a schedule of micro-batches through the stages.

Per batch: every stage executes its schedule (``schedule.py``) of forwards and backwards, moving
activations and their gradients with ``p2p.StageLink``; then the data-parallel engine's optimizer
step (engine/optimizer_step.py) runs over this stage's strategy (stage_strategy.py): gradients
averaged over the data axis, tied copies summed across their stages, clipped by the one global norm
(every stage's squares summed, each tied weight counted once), the optimizer. A non-finite gradient
on any stage skips the step on every rank (precision.policy.skips_non_finite, the one rule).
What watches the batch (the stall beat, the schedule's timing) is called at its boundaries through
the data-parallel engine's StepObserver (engine/step_observer.py).
"""
from __future__ import annotations

from typing import Any, Iterator

import torch
import torch.distributed as dist

from launcher.zero.checkpoint import pipeline_save_load
from launcher.zero.distributed.parallel_layout import ParallelLayout
from launcher.zero.engine.accessors import ConfigAccessors, RankAccessors, StepCounterAccessors
from launcher.zero.engine.optimizer_step import StepCounters, StepRules, take_model_step
from launcher.zero.engine.step_observer import StepObserver
from launcher.zero.errors import ConfigError, NotSupportedError
from launcher.zero.parallel.grid import ParallelGrid
from launcher.zero.pipeline.module import PipelineModule
from launcher.zero.pipeline.p2p import StageLink
from launcher.zero.pipeline.schedule import BACKWARD, FORWARD, build_schedule
from launcher.zero.pipeline.stage_strategy import PipelineStageStrategy
from launcher.zero.precision.policy import precision_policy, skips_non_finite
from launcher.zero.stages.base import StrategyContext


class PipelineEngine(ConfigAccessors, RankAccessors, StepCounterAccessors):
    """DeepSpeed's ``PipelineEngine`` surface: ``train_batch``, ``eval_batch``, ``grid``, counters.

    ``parallel``: the job's layout (distributed/parallel_layout.py), built from ``grid``; its data axis
    (``dist_context``) is this rank's data-parallel ranks (the group ZeRO-1 shards over), with the
    process's local rank and device, so ``dp_world_size``, ``local_rank`` and ``device`` read as
    on the data-parallel engine (RankAccessors)."""

    def __init__(self, module: PipelineModule, optimizer, lr_scheduler, config, parallel: ParallelLayout,
                 grid: ParallelGrid, schedule: str = "1f1b", masters: list | None = None, loss_scaler=None, shard=None,
                 grad_holders: list | None = None):
        self.module = module
        #: ZeRO-1: the optimizer steps this data rank's partition of the stage (shard.py); None at stage 0
        self.shard = shard
        # fp16/bf16: the optimizer steps fp32 ``masters`` (one per trainable parameter, same order)
        self.masters = masters
        # fp16/bf16 at ZeRO-1: no whole fp32 copies, only fp32 gradients (``GradHolder``, same order);
        # the fp32 master is the shard's slice
        self.grad_holders = grad_holders
        self.loss_scaler = loss_scaler
        self._param_dtype = next((p.dtype for p in module.parameters()), torch.float32)
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.zero_config = config
        self.parallel = parallel           # every collective below asks it for its group
        self.dist_context = dist_context = parallel.data
        self.schedule_name = schedule
        self.grid = grid
        self.num_stages = self.grid.pipe_parallel_size
        self.stage_id = self.grid.stage_id
        self.micro_batches = config.gradient_accumulation_steps
        self.counters = StepCounters()     # global_steps, global_samples, skipped_steps (StepCounterAccessors)
        self.observer = StepObserver(self.counters)   # the stall beat and the schedule's timing (step_observer.py)
        self._step_rules = StepRules(skips_non_finite=skips_non_finite(self._param_dtype, config),
                                     clip=config.gradient_clipping, device=dist_context.device)
        self._global_grad_norm: float | None = None
        self._step_applied = False
        self.data_iterator: Iterator | None = None
        self._link = StageLink(dist_context.device)
        self.num_chunks = module.num_virtual_stages
        # interleaved: a pair of ranks carries activations and gradients both ways, so each kind gets its own
        # group (its own FIFO, on gloo and NCCL alike); one chunk per rank keeps the default group
        self._channels = ({FORWARD: dist.new_group(), BACKWARD: dist.new_group()} if self.num_chunks > 1
                          else {FORWARD: None, BACKWARD: None})
        self._tie_groups = self._build_tie_groups()
        self._sync_tied_weights()
        tied = {key: (ranks, group, self._tied_params(key)) for key, (ranks, group) in self._tie_groups.items()}
        context = StrategyContext(config=config, parallel=parallel, precision=precision_policy(config))
        self.strategy = PipelineStageStrategy(context, masters, grad_holders, shard, tied)
        self.strategy.setup(module, optimizer)
        # fp32 masters and the ZeRO-1 slice were taken before the ties were synced: take them again
        if self.masters is not None:
            with torch.no_grad():
                for param, master in self._holders():
                    master.copy_(param.float())
        if self.shard is not None:
            self.shard.refresh()

    @property
    def config(self) -> dict:
        """The config as a dict, DeepSpeed's ``engine.config``; the typed one is ``zero_config``."""
        return self.zero_config.raw

    @property
    def schedule_timing(self) -> dict[str, float]:
        """The last schedule's ``wall_s`` and ``recv_wait_s`` (time blocked in receives); empty before one."""
        return self.observer.schedule_timing

    # ---- DeepSpeed's accessors (the config's own are ConfigAccessors') --------------------
    def is_first_stage(self) -> bool:
        return self.stage_id == 0

    def is_last_stage(self) -> bool:
        return self.stage_id == self.num_stages - 1

    @property
    def mp_world_size(self) -> int:
        """The ranks that hold one replica of the model: stages times tensor ranks. DeepSpeed's
        meaning for a pipeline (its grid's model-parallel group is every rank of one data replica;
        recorded with DeepSpeed 0.19.8: 2 on pipe 2 x data 2, 4 on pipe 2 x tensor 2 x data 2),
        so ``world_size == dp_world_size * mp_world_size`` as on the data-parallel engine."""
        return self.grid.pipe_parallel_size * self.grid.model_parallel_size

    def get_global_grad_norm(self) -> float | None:
        return self._global_grad_norm

    def was_step_applied(self) -> bool:
        """Whether the last ``train_batch`` stepped the optimizer (False when it was skipped)."""
        return self._step_applied

    def set_dataiterator(self, iterator: Iterator) -> None:
        self.data_iterator = iterator

    def parameters(self):
        return self.module.parameters()

    def state_dict(self, *args, **kwargs):
        return self.module.state_dict(*args, **kwargs)

    module_state_dict = state_dict

    def __call__(self, *args, **kwargs):
        raise ConfigError("a pipeline engine is not called per micro-batch", hint="use engine.train_batch(data_iter)")

    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest: bool = True,
                        exclude_frozen_parameters: bool = False) -> str:
        """Collective: every stage's layers and optimizer under ``save_dir/<tag>`` (checkpoint/pipeline_save_load.py).
        ``save_latest=False`` leaves ``latest`` as it was; ``exclude_frozen_parameters`` leaves the
        parameters without ``requires_grad`` out of the layer files (load with ``load_module_strict=False``)."""
        return pipeline_save_load.save(self, save_dir, tag, client_state, save_latest=save_latest,
                    exclude_frozen_parameters=exclude_frozen_parameters)

    def load_checkpoint(self, load_dir, tag=None, load_module_strict: bool = True, load_optimizer_states: bool = True,
                        load_lr_scheduler_states: bool = True, load_module_only: bool = False, custom_load_fn=None):
        """Returns ``(tag folder, client_state)``, or ``(None, None)`` when there is no checkpoint.
        ``load_module_only``: the weights alone; ``load_optimizer_states=False``: all but the optimizer
        state (the scheduler and the step counters too, as DeepSpeed), also at another pipeline layout."""
        if custom_load_fn is not None:   # DeepSpeed's pipeline engine does not take one either
            raise NotSupportedError("load_checkpoint(custom_load_fn=...) is not supported with pipeline parallelism",
                                    hint="leave custom_load_fn out: each stage loads its own layer files")
        return pipeline_save_load.load(self, load_dir, tag, load_module_strict, load_optimizer_states, load_lr_scheduler_states,
                    load_module_only)

    # ---- ties ---------------------------------------------------------------------------
    def _build_tie_groups(self) -> dict[str, tuple[list[int], Any]]:
        """For each tie key spread over several stages, the group of its copies at this rank's coordinates."""
        topo, mine = self.grid.topology(), {}
        for key, stages in sorted(self.module.tied_stages().items()):
            if len(stages) < 2:
                continue
            others = [axis for axis in topo.get_axis_names() if axis != "pipe"]
            for fixed in _coordinates(topo, others):
                ranks = [topo.get_rank(pipe=stage, **fixed) for stage in stages]
                group = dist.new_group(ranks=ranks)
                if self.global_rank in ranks:
                    mine[key] = (ranks, group)
        return mine

    def _tied_params(self, key: str) -> list[torch.Tensor]:
        module = self.module.tied_modules[key]
        return [getattr(module, attr) for attr in self.module.tied_weight_attrs[key]]

    def _sync_tied_weights(self) -> None:
        """Start every copy of a tied weight from the first stage's copy."""
        for key, (ranks, group) in self._tie_groups.items():
            for param in self._tied_params(key):
                dist.broadcast(param.data, src=ranks[0], group=group)

    # ---- the batch ----------------------------------------------------------------------
    def _next_batches(self, data_iter: Iterator | None) -> list[Any]:
        if not (self.is_first_stage() or self.is_last_stage()):
            return [None] * self.micro_batches
        iterator = data_iter if data_iter is not None else self.data_iterator
        if iterator is None:
            raise ConfigError("train_batch: no data (pass data_iter, or training_data to initialize)",
                              hint="engine.train_batch(iter(loader))")
        return [next(iterator) for _ in range(self.micro_batches)]

    def _peer(self, stage: int) -> int:
        return self.grid.stage_to_global(stage)

    def _is_first(self, chunk: int) -> bool:
        return self.is_first_stage() and chunk == 0

    def _is_last(self, chunk: int) -> bool:
        return self.is_last_stage() and chunk == self.num_chunks - 1

    def _neighbour(self, chunk: int, step: int) -> int:
        """The global rank of the virtual stage ``step`` (-1 or +1) away from this rank's ``chunk``."""
        return self._peer((chunk * self.num_stages + self.stage_id + step) % self.num_stages)

    def _forward(self, micro: int, chunk: int, batch: Any, state: dict) -> None:
        if self._is_first(chunk):
            inputs = _to(batch[0], self.device)
            if isinstance(inputs, torch.Tensor) and inputs.is_floating_point():
                inputs = inputs.to(self._param_dtype)
        else:
            inputs = self._link.recv(self._neighbour(chunk, -1), self._channels[FORWARD])
            if torch.is_grad_enabled() and inputs.is_floating_point():
                inputs.requires_grad_()
        outputs = self.module(inputs, chunk=chunk) if self.num_chunks > 1 else self.module(inputs)
        if self._is_last(chunk):
            # DeepSpeed's: without a loss_fn (or in an eval without compute_loss) the output is the value
            # kept, a loss when the model computes its own in its last layer
            state["logits"] = outputs.detach()
            if state["compute_loss"] and self.module.loss_fn is not None:
                outputs = self.module.loss_fn(outputs, _to(batch[1], self.device))
            state["losses"].append(outputs.detach().float())
        else:
            self._link.send(outputs, self._neighbour(chunk, +1), self._channels[FORWARD])
        state["inputs"][chunk, micro], state["outputs"][chunk, micro] = inputs, outputs

    def _backward(self, micro: int, chunk: int, state: dict) -> None:
        inputs, outputs = state["inputs"].pop((chunk, micro)), state["outputs"].pop((chunk, micro))
        if self._is_last(chunk):
            (outputs.float() * (self.get_loss_scale() / self.micro_batches)).backward()
        else:
            grad = self._link.recv(self._neighbour(chunk, +1), self._channels[BACKWARD])
            torch.autograd.backward(outputs, grad_tensors=grad)
        if not self._is_first(chunk):
            grad = inputs.grad if inputs.grad is not None else torch.zeros_like(inputs)
            self._link.send(grad, self._neighbour(chunk, -1), self._channels[BACKWARD])

    def _run_schedule(self, batches: list[Any], train: bool, compute_loss: bool = True) -> dict:
        """Execute this stage's actions. The state returned holds, on the last stage, each micro-batch's
        loss (``losses``) and the last micro-batch's outputs (``logits``)."""
        state = {"inputs": {}, "outputs": {}, "losses": [], "logits": None, "compute_loss": compute_loss}
        with self.observer.schedule(self._link):
            actions = build_schedule(self.schedule_name, self.micro_batches, self.num_stages, self.stage_id,
                                     self.num_chunks)
            if not train:   # the forwards alone, in the schedule's order (the same on every rank)
                actions = [action for action in actions if action[0] == FORWARD]
            with torch.set_grad_enabled(train):
                for action in actions:
                    kind, micro, chunk = action[0], action[1], (action[2] if len(action) > 2 else 0)
                    if kind == FORWARD:
                        self._forward(micro, chunk, batches[micro], state)
                    elif kind == BACKWARD:
                        self._backward(micro, chunk, state)
            self._link.wait_sends()
        return state

    def _mean_loss(self, losses: list[torch.Tensor]) -> torch.Tensor:
        """The batch's mean loss, averaged over the data axis, on every stage (broadcast from the last)."""
        loss = torch.stack(losses).mean() if losses else torch.zeros((), device=self.device)
        if self.is_last_stage() and self.parallel.size("data") > 1:
            dist.all_reduce(loss, group=self.parallel.group("data"))
            loss /= self.parallel.size("data")
        if self.num_stages > 1:
            dist.broadcast(loss, src=self._peer(self.num_stages - 1), group=self.parallel.group("pipe"))
        return loss

    def train_batch(self, data_iter: Iterator | None = None) -> torch.Tensor:
        """Run ``gradient_accumulation_steps`` micro-batches and one optimizer step; return the mean loss.
        Without a ``loss_fn`` the last stage's output is the loss (DeepSpeed's rule)."""
        self.module.train()
        self.observer.batch_begins()
        losses = self._run_schedule(self._next_batches(data_iter), train=True)["losses"]
        self.observer.step_reached()
        self._step()
        return self._mean_loss(losses)

    def eval_batch(self, data_iter: Iterator, return_logits: bool = False, compute_loss: bool = True,
                   reduce_output: str | None = "avg", bcast_loss: bool = True, num_micro_batches: int | None = None):
        """DeepSpeed's: forward ``num_micro_batches`` (default: gradient_accumulation_steps) without gradients.

        The last stage keeps ``loss_fn(outputs, labels)`` of each micro-batch, or the outputs themselves
        (no ``loss_fn``, or ``compute_loss=False``); ``reduce_output="avg"`` averages them over the
        micro-batches and the data ranks, ``None`` returns the list. With ``compute_loss`` and
        ``bcast_loss`` every stage gets that result (float32), else the other stages get None.
        ``return_logits``: ``(result, the last micro-batch's outputs)``, None off the last stage."""
        if reduce_output not in ("avg", None):
            raise ConfigError(f"eval_batch: reduce_output {reduce_output!r} is not supported",
                              hint='reduce_output="avg" (the mean) or None (each micro-batch\'s value)')
        self.module.eval()
        self.observer.batch_begins()
        count = num_micro_batches or self.micro_batches
        saved, self.micro_batches = self.micro_batches, count
        try:
            state = self._run_schedule(self._next_batches(data_iter), train=False, compute_loss=compute_loss)
        finally:
            self.micro_batches = saved
        result = None
        if self.is_last_stage():
            result = state["losses"] if reduce_output is None else self._data_mean(torch.stack(state["losses"]).mean(0))
        if compute_loss and bcast_loss:
            result = ([self._from_last_stage(v) for v in (result or [None] * count)] if reduce_output is None
                      else self._from_last_stage(result))
        return (result, state["logits"]) if return_logits else result

    def _data_mean(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` averaged over the data-parallel ranks (the last stage's)."""
        if self.parallel.size("data") > 1:
            dist.all_reduce(value, group=self.parallel.group("data"))
            value /= self.parallel.size("data")
        return value

    def _from_last_stage(self, value: torch.Tensor | None) -> torch.Tensor:
        """The last stage's ``value`` on every stage of this pipeline, as float32 (its shape sent first:
        outputs of any shape, not only a loss)."""
        if self.num_stages == 1:
            return value.float()
        source, group, last = self._peer(self.num_stages - 1), self.parallel.group("pipe"), value is not None
        ndim = torch.tensor([value.dim() if last else 0], device=self.device)
        dist.broadcast(ndim, src=source, group=group)
        shape = torch.tensor(list(value.shape) if last else [0] * int(ndim), dtype=torch.long, device=self.device)
        if int(ndim):
            dist.broadcast(shape, src=source, group=group)
        data = value.float().contiguous() if last else torch.empty(shape.tolist(), device=self.device)
        dist.broadcast(data, src=source, group=group)
        return data

    # ---- the step: the data-parallel engine's own (engine/optimizer_step.py) ----------------
    def _holders(self) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
        """(parameter, the tensor whose .grad the step uses): the parameter itself, or its fp32 master."""
        return self.strategy.holders()

    def _step(self) -> None:
        """The one optimizer step over this stage's gradients (the data-parallel engine's skip rule,
        clip factor, scaler and counters); ZeRO-1 steps this data rank's slice (``shard``)."""
        outcome = take_model_step(self.strategy, self.optimizer, self.loss_scaler, self.lr_scheduler, self._step_rules,
                                  self.counters, self.train_batch_size())
        self._global_grad_norm, self._step_applied = outcome.norm, outcome.applied


def _to(value: Any, device: torch.device) -> Any:
    return value.to(device) if isinstance(value, torch.Tensor) else value


def _coordinates(topo, axes: list[str]) -> list[dict[str, int]]:
    from itertools import product
    return [dict(zip(axes, values)) for values in product(*(range(topo.get_dim(a)) for a in axes))]
