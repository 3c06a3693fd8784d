"""1-bit Adam (DeepSpeed 0.16.5's OnebitAdam): Adam whose momentum, after a warm-up, is
averaged over ranks at 1 bit per element with error feedback.

Steps 1..freeze_step (warm-up): gradients are averaged in full precision (this optimizer
does the all-reduce itself, hence `handles_gradient_communication`), then
m = b1*m + (1-b1)*g and v = b2*v + (1-b2)*g^2. Later steps: v is frozen, m is updated with
the local gradient and then replaced by its 1-bit compressed average (compression.py).
Both phases: p -= lr * (m / (sqrt(v) + eps) + weight_decay * p). As in DeepSpeed, no bias
correction is applied (`bias_correction` is accepted for config compatibility).
"""

import torch

from launcher.zero.errors import ConfigError
from launcher.zero.optim.onebit.counted_collectives import Collectives, CommCounter, allreduce_sent_bytes
from launcher.zero.optim.onebit.compression import padded_numel

SUPPORTED_BACKENDS = ("nccl", "gloo")
DEEPSPEED_ONLY_BACKENDS = ("mpi", "hccl", "compressed")


def _check_args(lr, betas, eps, weight_decay, freeze_step, comm_backend_name, amsgrad):
    """Raise ConfigError naming the first bad optimizer parameter."""
    if not lr >= 0.0:
        raise ConfigError(f"optimizer.params.lr must be >= 0, got {lr}")
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ConfigError(f"optimizer.params.betas must be two numbers in [0, 1), got {betas}")
    if not eps > 0.0:
        raise ConfigError(f"optimizer.params.eps must be > 0, got {eps}")
    if not weight_decay >= 0.0:
        raise ConfigError(f"optimizer.params.weight_decay must be >= 0, got {weight_decay}")
    if isinstance(freeze_step, bool) or not isinstance(freeze_step, int) or freeze_step < 0:
        raise ConfigError(f"optimizer.params.freeze_step must be a whole number >= 0, got {freeze_step!r}")
    if amsgrad:
        raise ConfigError("OneBitAdam does not support amsgrad", hint="remove optimizer.params.amsgrad")
    if comm_backend_name in DEEPSPEED_ONLY_BACKENDS:
        raise ConfigError(f"OneBitAdam comm_backend_name {comm_backend_name!r} is not supported by dslaunch",
                          hint="use 'nccl' on GPUs or 'gloo' on CPU")
    if comm_backend_name not in SUPPORTED_BACKENDS:
        raise ConfigError(f"OneBitAdam comm_backend_name must be one of {SUPPORTED_BACKENDS}, "
                          f"got {comm_backend_name!r}")


class OnebitAdam(torch.optim.Optimizer):
    """1-bit Adam over `process_group` (default: the whole world); see the module docstring."""

    handles_gradient_communication = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 freeze_step=100000, comm_backend_name="nccl", cuda_aware=False, process_group=None,
                 bias_correction=True, amsgrad=False, eps_inside_sqrt=False, max_grad_norm=0.0):
        betas = tuple(betas)
        _check_args(lr, betas, eps, weight_decay, freeze_step, comm_backend_name, amsgrad)
        # eps_inside_sqrt and max_grad_norm: DeepSpeed's signature takes them and its step reads
        # neither; kept in the defaults so configs that set them run the same here
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, bias_correction=bias_correction,
                        eps_inside_sqrt=eps_inside_sqrt, max_grad_norm=max_grad_norm)
        super().__init__(params, defaults)
        self.freeze_step = freeze_step
        self.comm_backend_name = comm_backend_name
        self.cuda_aware = cuda_aware  # only meaningful for DeepSpeed's MPI backend; kept for configs
        self.process_group = process_group
        self.comm_counter = CommCounter()
        self.last_step_comm: dict = {}
        self._collectives = None
        self._worker_error = None
        self._server_error = None
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            self._comm()  # a backend mismatch is reported now, not at the first step

    @property
    def global_step(self) -> int:
        """Steps taken, kept as each parameter's state['step'] so any checkpoint format that
        saves per-parameter state (the engine's does) restores the phase too."""
        for p in (p for group in self.param_groups for p in group["params"]):
            if "step" in self.state.get(p, {}):
                return int(self.state[p]["step"])
        return 0

    @property
    def compressing(self) -> bool:
        """True once the warm-up is over: the next step uses 1-bit communication."""
        return self.global_step >= self.freeze_step

    def _comm(self) -> Collectives:
        # Built at the first step, not in __init__: the process group may come up later.
        if self._collectives is None:
            comm = Collectives(self.process_group, self.comm_counter)
            backend = comm.backend()
            if backend is not None and backend != self.comm_backend_name:
                raise ConfigError(f"OneBitAdam comm_backend_name is {self.comm_backend_name!r} but the "
                                  f"process group uses {backend!r}",
                                  hint=f"set optimizer.params.comm_backend_name to {backend!r}")
            self._collectives = comm
        return self._collectives

    def _params(self):
        # requires_grad is the same on every rank (a grad may not be); the engine's flat fp32
        # masters do not require grad but carry one.
        return [p for group in self.param_groups for p in group["params"] if p.requires_grad or p.grad is not None]

    def _local_grads(self, params):
        # A missing grad counts as zero so every rank joins the same collectives.
        return [p.grad.detach().float() if p.grad is not None else torch.zeros_like(p, dtype=torch.float32)
                for p in params]

    def _state_of(self, p):
        state = self.state[p]
        if not state:
            state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format)
        return state

    def _averaged_grads(self, params):
        grads = self._local_grads(params)
        if not grads:
            return grads
        flat = torch.cat([g.reshape(-1) for g in grads])
        self._comm().all_reduce_mean(flat)
        return [chunk.view_as(g) for chunk, g in zip(flat.split([g.numel() for g in grads]), grads)]

    def _compressed_momentum(self, momenta) -> None:
        """Replace every rank's momenta by their 1-bit averaged value, in place."""
        comm = self._comm()
        numel = sum(m.numel() for m in momenta)
        padded = padded_numel(numel, comm.world_size)
        device = momenta[0].device
        if self._worker_error is None or self._worker_error.numel() != padded:
            self._worker_error = torch.zeros(padded, device=device)
            self._server_error = torch.zeros(padded // comm.world_size, device=device)
        flat = torch.zeros(padded, device=device)
        flat[:numel] = torch.cat([m.reshape(-1) for m in momenta])
        averaged = comm.compressed_allreduce(flat, self._worker_error, self._server_error)
        for m, chunk in zip(momenta, averaged[:numel].split([m.numel() for m in momenta])):
            m.copy_(chunk.view_as(m))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = self._params()
        if not params:
            return loss
        if len({p.device for p in params}) > 1:
            raise ConfigError("OneBitAdam needs every parameter on one device",
                              hint="move the model to one device before building the optimizer")
        before = self.comm_counter.snapshot()
        compressing = self.compressing
        group_of = {p: group for group in self.param_groups for p in group["params"]}
        grads = self._local_grads(params) if compressing else self._averaged_grads(params)
        states = [self._state_of(p) for p in params]
        for p, g, state in zip(params, grads, states):
            beta1, beta2 = group_of[p]["betas"]
            state["exp_avg"].mul_(beta1).add_(g, alpha=1 - beta1)
            if not compressing:
                state["exp_avg_sq"].mul_(beta2).addcmul_(g, g, value=1 - beta2)
        if compressing:
            self._compressed_momentum([s["exp_avg"] for s in states])
        for p, state in zip(params, states):
            group = group_of[p]
            update = state["exp_avg"] / (state["exp_avg_sq"].sqrt() + group["eps"])
            if group["weight_decay"] > 0:
                update.add_(p.float(), alpha=group["weight_decay"])
            p.add_(update.to(p.dtype), alpha=-group["lr"])
        step = torch.tensor(float(self.global_step + 1))
        for state in states:
            state["step"] = step.clone()
        self.last_step_comm = dict(self.comm_counter.since(before), phase="compressed" if compressing else "warmup",
                                   step=self.global_step)
        return loss

    def fp32_allreduce_bytes(self) -> dict:
        """What one full-precision gradient all-reduce of these parameters costs this rank."""
        world_size = self._comm().world_size
        nbytes = 4 * sum(p.numel() for p in self._params())
        return {"payload_bytes": nbytes if world_size > 1 else 0,
                "sent_bytes": allreduce_sent_bytes(nbytes, world_size)}

    def extra_state_dict(self) -> dict:
        """This rank's error buffers (they differ per rank), tagged with rank and world size."""
        comm = self._collectives
        return {
            "rank": comm.rank if comm else None,
            "world_size": comm.world_size if comm else None,
            "worker_error": None if self._worker_error is None else self._worker_error.detach().cpu().clone(),
            "server_error": None if self._server_error is None else self._server_error.detach().cpu().clone(),
        }

    def load_extra_state_dict(self, extra: dict) -> None:
        """Restore the error buffers when saved by this rank at this world size; otherwise
        they restart at zero (what DeepSpeed always does on load)."""
        self._worker_error = self._server_error = None
        comm = self._comm()
        same_rank = extra.get("rank") == comm.rank and extra.get("world_size") == comm.world_size
        if same_rank and extra.get("worker_error") is not None:
            # any parameter tells the device: right after a load none has a grad yet
            device = next(p for group in self.param_groups for p in group["params"]).device
            self._worker_error = extra["worker_error"].to(device=device, dtype=torch.float32).clone()
            self._server_error = extra["server_error"].to(device=device, dtype=torch.float32).clone()

    def state_dict(self):
        state = super().state_dict()
        state["onebit"] = self.extra_state_dict()
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        extra = state_dict.pop("onebit", None) or {}
        super().load_state_dict(state_dict)
        self.load_extra_state_dict(extra)
