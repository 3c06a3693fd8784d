"""DeepSpeed 0.19's ``Muon`` optimizer type: Muon for the model's matrices, Adam for the rest.

A parameter takes Muon when, as a layer, it has two or more dimensions and its name holds neither
``embed`` nor ``lm_head`` (``tag_matrices``, DeepSpeed's rule); the rest go to an auxiliary Adam.
Muon's step: a Nesterov momentum of the whole matrix's gradient, orthogonalized by five
Newton-Schulz iterations, scaled by sqrt(max(1, rows / cols)), applied with decoupled weight decay.
The config's ``muon_lr`` and ``adam_lr`` override the shared ``lr`` for their half.

At ZeRO 1 and 2 a master holds a flat partition that may cut a matrix anywhere, so the step
all-gathers the group's gradient and momentum partitions, orthogonalizes every matrix that reaches
into this rank's partition, and keeps its own slice (``MatrixShard``, attached after the stage is
set up). At stage 3 a master holds a shard of each matrix (or a small persistent one whole), and
the shards are gathered the same way (``PieceShard``; DeepSpeed needs reduce_scatter false there).
Where that happens follows DeepSpeed, because the gradient clip sees different tensors: at ZeRO 1-3
before the global norm (the clip scales the orthogonalized updates), at stage 0 inside the step
(the clip scales the raw gradients the momentum takes).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from launcher.zero.distributed.collectives import all_gather_into

# DeepSpeed's defaults for each half, and the keys each half takes from the config
MUON_DEFAULTS = {"lr": 0.02, "momentum": 0.95, "weight_decay": 0.0, "ns_method": "gram"}
ADAM_DEFAULTS = {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-10, "weight_decay": 0.0}
NS_METHODS = ("gram", "standard")
NS_STEPS = 5
_QUINTIC = (3.4445, -4.7750, 2.0315)   # the Newton-Schulz polynomial's coefficients
_GRAM_RESTART = 2                      # the Gram iteration re-forms X at this step (half-precision drift)


def tag_matrices(model: torch.nn.Module) -> None:
    """Set ``use_muon`` on every parameter by DeepSpeed's rule (a user's own tag is overwritten, as there)."""
    for name, param in model.named_parameters():
        shape = tuple(getattr(param, "ds_shape", None) or param.shape)
        lowered = name.lower()
        param.use_muon = len(shape) >= 2 and "embed" not in lowered and "lm_head" not in lowered


def muon_param_groups(params, settings: dict) -> list[dict]:
    """Each incoming group split into a Muon half and an Adam half. A value is taken from, last one
    winning: the config's shared key, ``muon_lr`` / ``adam_lr``, the group's own key."""
    items = [params] if torch.is_tensor(params) else list(params)
    groups = [dict(item) for item in items if isinstance(item, dict)]
    loose = [item for item in items if not isinstance(item, dict)]
    if loose or not groups:
        groups.append({"params": loose})
    halves = ((True, "muon", MUON_DEFAULTS, "muon_lr"), (False, "adam", ADAM_DEFAULTS, "adam_lr"))
    result = []
    for index, group in enumerate(groups):
        members = [group["params"]] if torch.is_tensor(group["params"]) else list(group["params"])
        untagged = [p for p in members if not hasattr(p, "use_muon")]
        if untagged:
            raise ValueError(f"{len(untagged)} parameters have no use_muon tag: model_parameters holds parameters "
                             "the model does not; set param.use_muon = True / False on them")
        for use_muon, label, defaults, lr_key in halves:
            half = [p for p in members if p.requires_grad and bool(p.use_muon) is use_muon]
            if not half:
                continue
            values = dict(defaults)
            values.update({key: settings[key] for key in defaults if key in settings})
            if lr_key in settings:
                values["lr"] = settings[lr_key]
            values.update({key: group[key] for key in defaults if key in group})
            prefix = group.get("name") or (f"group{index}" if len(groups) > 1 else None)
            if "betas" in values:
                values["betas"] = tuple(values["betas"])
            result.append({"params": half, "use_muon": use_muon,
                           "name": f"{prefix}-{label}-params" if prefix else f"{label}-params", **values})
    return result


def ns_dtype(method: str, device: torch.device) -> torch.dtype:
    """The dtype DeepSpeed's accelerator picks for the iteration: Gram in fp16, standard in bf16,
    fp32 where the device lacks it (on CPU, fp16 only with oneDNN's fp16 kernels)."""
    if method == "gram":
        if device.type == "cuda":
            return torch.float16
        return torch.float16 if _cpu_fp16() else torch.float32
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    return torch.bfloat16


def _cpu_fp16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except Exception:  # noqa: BLE001 - an older torch without the probe: no fp16 kernels
        return False


def _standard_iteration(x: torch.Tensor, steps: int) -> torch.Tensor:
    a, b, c = _QUINTIC
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x


def orthogonalize_standard(matrix: torch.Tensor, steps: int) -> torch.Tensor:
    """The quintic Newton-Schulz iteration on the matrix itself (normalized in the compute dtype)."""
    tall = matrix.size(-2) > matrix.size(-1)
    x = matrix.to(ns_dtype("standard", matrix.device))
    x = x.mT if tall else x
    x = _standard_iteration(x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7), steps)
    return x.mT if tall else x


def orthogonalize_gram(matrix: torch.Tensor, steps: int) -> torch.Tensor:
    """The same polynomial carried on the small Gram matrix R = X X^T (wide X); X is formed only at the
    restart and at the end. Square matrices gain nothing and take the standard iteration."""
    tall = matrix.size(-2) > matrix.size(-1)
    x = matrix.to(torch.float32 if matrix.dtype == torch.float16 else matrix.dtype)
    x = x.mT if tall else x
    x = (x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)).to(ns_dtype("gram", matrix.device))
    if x.size(-1) <= x.size(-2):
        x = _standard_iteration(x, steps)
        return x.mT if tall else x
    a, b, c = _QUINTIC
    r, q = x @ x.mT, None
    for step in range(steps):
        if step == _GRAM_RESTART:
            x = q @ x
            r, q = x @ x.mT, None
        z = b * r + c * r @ r
        if q is None:
            q = z.clone()
            q.diagonal(dim1=-2, dim2=-1).add_(a)
        else:
            q = a * q + z @ q
        if step < steps - 1 and step + 1 != _GRAM_RESTART:
            rz = a * r + z @ r
            r = a * rz + z @ rz
    return x.mT @ q.mT if tall else q @ x


def muon_direction(grad: torch.Tensor, momentum: torch.Tensor, beta: float, ns_method: str) -> torch.Tensor:
    """The Muon update of one matrix (``grad`` is consumed): the momentum takes the gradient (not
    when it is non-finite, so a skipped step leaves it alone), the Nesterov blend is orthogonalized
    and scaled for the matrix's aspect ratio; a non-finite gradient comes back as itself."""
    finite = torch.isfinite(grad).all()
    momentum.copy_(torch.where(finite, momentum.lerp(grad, 1 - beta), momentum))
    blend = grad.lerp_(momentum, beta)
    rows, cols = grad.size(-2), grad.size(-1)
    if blend.ndim == 4:   # a convolution's filters, as one matrix per output channel
        blend = blend.view(len(blend), -1)
    orthogonal = orthogonalize_gram if ns_method == "gram" else orthogonalize_standard
    update = orthogonal(blend, NS_STEPS) * (math.sqrt(rows / cols) if rows > cols else 1.0)
    return torch.where(finite, update.to(grad.dtype), grad)


def _gather_pairs(grad: torch.Tensor, momentum: torch.Tensor, context) -> torch.Tensor:
    """Every rank's (gradient, momentum) of one master in one all-gather: shape (ranks, 2, numel)."""
    pair = torch.stack((grad, momentum.to(grad.dtype)))
    whole = torch.empty(pair.numel() * context.world_size, dtype=grad.dtype, device=grad.device)
    all_gather_into(whole, pair.reshape(-1), context)
    return whole.view(context.world_size, 2, -1)


@dataclass(frozen=True)
class MatrixShard:
    """A stage 0-2 Muon master's place in its group's flat buffer: the parameters' slots, this rank's
    range [low, high), and the ranks to gather the other partitions from (None: the master is whole)."""

    slots: tuple          # ParamSlot: offset, numel, shape
    low: int
    high: int
    dist_context: object = None

    def update(self, local: torch.Tensor, kept: torch.Tensor, beta: float, ns_method: str) -> torch.Tensor:
        """This range's Muon update; ``kept`` (the range's momentum) is advanced in place."""
        if self.dist_context is None:
            grads, momenta, base = local, kept, self.low
        else:
            whole = _gather_pairs(local, kept, self.dist_context)
            grads, momenta, base = whole[:, 0].reshape(-1), whole[:, 1].reshape(-1), 0
        update = torch.zeros_like(local)
        for slot in self.slots:
            low, high = max(self.low, slot.offset), min(self.high, slot.offset + slot.numel)
            if low >= high:
                continue
            start = slot.offset - base
            grad = grads[start:start + slot.numel].clone().view(slot.shape)
            momentum = momenta[start:start + slot.numel].clone().view(slot.shape)
            direction = muon_direction(grad, momentum, beta, ns_method).reshape(-1)
            mine, theirs = slice(low - self.low, high - self.low), slice(low - slot.offset, high - slot.offset)
            update[mine] = direction[theirs]
            kept[mine] = momentum.reshape(-1)[theirs]
        return update


@dataclass(frozen=True)
class PieceShard:
    """A stage 3 Muon master: each parameter's piece of it (Stage3Slot), a shard of the matrix or,
    for a persistent one, the whole matrix; and the ranks holding the other shards (None: one rank)."""

    slots: tuple          # Stage3Slot: offset, length, numel, shape, persistent, param_start, param_end
    dist_context: object = None

    def update(self, local: torch.Tensor, kept: torch.Tensor, beta: float, ns_method: str) -> torch.Tensor:
        """This rank's pieces of the Muon updates; ``kept`` (their momentum) is advanced in place."""
        sharded = [slot for slot in self.slots if not slot.persistent]
        whole = _gather_pairs(local, kept, self.dist_context) if sharded and self.dist_context else None
        update = torch.zeros_like(local)
        for slot in self.slots:
            if whole is None or slot.persistent:   # the whole matrix is here (gradients all-reduced)
                mine, theirs = slice(slot.offset, slot.offset + slot.numel), slice(0, slot.numel)
                grad, momentum = local[mine].clone(), kept[mine].clone()
            else:   # every rank's shard, padding cut off
                mine, theirs = slice(slot.offset, slot.offset + slot.covered), slice(slot.param_start, slot.param_end)
                pieces = whole[:, :, slot.offset:slot.offset + slot.length]
                grad = pieces[:, 0].reshape(-1)[:slot.numel].clone()
                momentum = pieces[:, 1].reshape(-1)[:slot.numel].clone()
            grad, momentum = grad.view(slot.shape), momentum.view(slot.shape)
            update[mine] = muon_direction(grad, momentum, beta, ns_method).reshape(-1)[theirs]
            kept[mine] = momentum.reshape(-1)[theirs]
        return update


class MuonWithAdam(torch.optim.Optimizer):
    """Param groups carry ``use_muon``; Muon groups step as above, the others as Adam (decoupled
    weight decay unless ``adam_w_mode`` is false, then L2 added to the gradient)."""

    def __init__(self, param_groups: list[dict], adam_w_mode: bool = True):
        for group in param_groups:
            if "use_muon" not in group:
                raise ValueError("every param group needs use_muon (muon_param_groups builds them)")
            if group["use_muon"] and group.get("ns_method", "gram") not in NS_METHODS:
                raise ValueError(f"ns_method must be one of {NS_METHODS}, got {group['ns_method']!r}")
            for key, value in (MUON_DEFAULTS if group["use_muon"] else ADAM_DEFAULTS).items():
                group.setdefault(key, value)
        super().__init__(param_groups, {})
        self.adam_w_mode = adam_w_mode
        self.shards: dict[int, MatrixShard] = {}
        self.grads_are_updates = False   # set by orthogonalize_grads, cleared by the step

    def attach_shards(self, shards: dict) -> None:
        """Master tensor id -> its MatrixShard; set once the stage has built the masters."""
        self.shards = dict(shards)

    @torch.no_grad()
    def orthogonalize_grads(self) -> None:
        """Replace each Muon master's gradient by its Muon update (before the norm, ZeRO 1 and 2)."""
        for group in self.param_groups:
            if group["use_muon"]:
                for master in group["params"]:
                    if master.grad is None:
                        master.grad = torch.zeros_like(master)
                    master.grad.copy_(self._partition_update(master, self.shards[id(master)], group))
        self.grads_are_updates = True

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    param.grad = torch.zeros_like(param)
                if group["use_muon"]:
                    self._muon_step(param, group)
                else:
                    self._adam_step(param, group)
        self.grads_are_updates = False
        return loss

    def _muon_step(self, param: torch.Tensor, group: dict) -> None:
        shard = self.shards.get(id(param))
        if self.grads_are_updates:
            update = param.grad
        elif shard is None:   # a whole matrix, outside the engine's flat masters
            state = self.state[param]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(param)
            update = muon_direction(param.grad, state["momentum_buffer"], group["momentum"], group["ns_method"])
        else:
            update = self._partition_update(param, shard, group)
        param.mul_(1 - group["lr"] * group["weight_decay"])
        param.add_(update.reshape(param.shape), alpha=-group["lr"])

    def _partition_update(self, master: torch.Tensor, shard, group: dict) -> torch.Tensor:
        """The Muon update of this rank's part of the matrices (``shard``: MatrixShard or PieceShard).

        The momentum is kept element for element like the master (DeepSpeed keeps one flat buffer over
        the matrices a rank touches at ZeRO 1-2): a checkpoint then cuts it per parameter slice as it
        cuts Adam's moments, and resumes at any world size. Each matrix's gradient and momentum are
        gathered whole and advanced by the same arithmetic on every rank that holds a part of it."""
        local = master.grad.reshape(-1)
        state = self.state[master]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(local)
        return shard.update(local, state["momentum_buffer"].view(-1), group["momentum"], group["ns_method"])

    def _adam_step(self, param: torch.Tensor, group: dict) -> None:
        grad = param.grad if self.adam_w_mode else param.grad.add(param, alpha=group["weight_decay"])
        state = self.state[param]
        if "step" not in state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(param)
            state["exp_avg_sq"] = torch.zeros_like(param)
        state["step"] += 1
        beta1, beta2 = group["betas"]
        step = state["step"]
        state["exp_avg"].lerp_(grad, 1 - beta1)
        state["exp_avg_sq"].lerp_(grad.square(), 1 - beta2)
        average = state["exp_avg"] / (1 - beta1 ** step)
        spread = (state["exp_avg_sq"] / (1 - beta2 ** step)).sqrt().add_(group["eps"])
        if self.adam_w_mode:
            param.mul_(1 - group["lr"] * group["weight_decay"])
        param.addcdiv_(average, spread, value=-group["lr"])


def shards_of(strategy) -> dict:
    """Each Muon master of a strategy -> its MatrixShard (stages 0-2) or PieceShard (stage 3), by id."""
    if strategy.context.config.zero_stage == 3:
        return _stage3_shards(strategy)
    shards = {}
    for group, master in zip(strategy.groups, strategy.masters):
        if not strategy.optimizer.param_groups[group.index].get("use_muon"):
            continue
        low, high = strategy.partitioning.bounds(group)
        context = group.dist_context or strategy.context.dist_context
        gathered = strategy.partitioning.sharded and context.world_size > 1
        shards[id(master)] = MatrixShard(slots=tuple(group.layout.slots), low=low, high=high,
                                         dist_context=context if gathered else None)
    return shards


def _stage3_shards(strategy) -> dict:
    context = strategy.context.dist_context
    position = {id(master): index for index, master in enumerate(strategy.masters)}
    shards = {}
    for group in strategy.optimizer.param_groups:
        if group.get("use_muon"):
            for master in group["params"]:
                shards[id(master)] = PieceShard(slots=tuple(strategy.group_slots[position[id(master)]]),
                                                dist_context=context if context.world_size > 1 else None)
    return shards
