"""A fast Adam/AdamW step for flat fp32 buffers in host memory (ZeRO-Offload's optimizer).

The step runs torch's fused CPU Adam kernel (vectorized, torch >= 2.4, every core inside each
call) over contiguous chunks of one flat buffer, in order, and reports each finished chunk
(``on_chunk``) so that an engine can copy it back to the device while later chunks update; an
engine can also hand it the step's gradient factor (``grad_factor``: unscaling and clipping
applied as the kernel reads each gradient). ``step(params_16bit=...)`` also writes each chunk
into a 16-bit tensor. Without the fused kernel it falls back to the same arithmetic as
torch.optim.AdamW's single-tensor path, spread over a thread pool. Results equal torch.optim.AdamW.

Glossary: a *chunk* is a contiguous slice of the flat buffer updated by one kernel call.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import torch

# 64 MiB of fp32: the fused kernel parallelizes inside each call, so a chunk only needs to be
# large enough to amortize the call and small enough that the copy back can start early
DEFAULT_CHUNK_ELEMENTS = 1 << 24
_HAS_FUSED = hasattr(torch, "_fused_adamw_") and hasattr(torch, "_fused_adam_")


MOMENTS = ("exp_avg", "exp_avg_sq")


def default_num_threads() -> int:
    """One thread per core this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def _chunks(numel: int, chunk_elements: int) -> list[tuple[int, int]]:
    return [(start, min(numel, start + chunk_elements)) for start in range(0, numel, chunk_elements)]


def _step_reference(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay, adamw_mode,
                    bias_correction):
    """torch.optim.AdamW's single-tensor arithmetic, for one chunk."""
    if weight_decay:
        if adamw_mode:
            param.mul_(1 - lr * weight_decay)
        else:
            grad = grad.add(param, alpha=weight_decay)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    correction1 = 1 - beta1 ** step if bias_correction else 1.0
    correction2_sqrt = math.sqrt(1 - beta2 ** step) if bias_correction else 1.0
    denom = (exp_avg_sq.sqrt() / correction2_sqrt).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-lr / correction1)


class CPUAdam(torch.optim.Optimizer):
    """Adam/AdamW for fp32 CPU parameters, multi-threaded over chunks of each parameter.

    A parameter on an accelerator (``offload_optimizer.ratio``: the states kept on the device)
    is updated there, by the same fused kernel, its moments and step beside it.

    adamw_mode=True (DeepSpeed's default) decouples weight decay as torch.optim.AdamW;
    False adds it to the gradient as torch.optim.Adam. `step(params_16bit=...)` also writes
    each updated parameter into a same-shaped 16-bit (or any dtype) tensor.
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, adamw_mode: bool = True, bias_correction: bool = True,
                 num_threads: int | None = None, chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
                 use_fused: bool | None = None, fp32_optimizer_states: bool = True):
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"invalid Adam hyper-parameters lr={lr} betas={betas} eps={eps} "
                             f"weight_decay={weight_decay}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        adamw_mode=adamw_mode, bias_correction=bias_correction)
        super().__init__(params, defaults)
        self.use_fused = _HAS_FUSED if use_fused is None else (use_fused and _HAS_FUSED)
        # torch's fused kernel already runs on every core (intra-op threads): one caller is
        # enough; the reference arithmetic is several small ops, which threads overlap
        self.num_threads = num_threads or (1 if self.use_fused else default_num_threads())
        self.chunk_elements = int(chunk_elements)
        #: DeepSpeedCPUAdam's switch: False keeps a bf16 parameter's moments in bf16 (bf16_optimizer_states)
        self.fp32_optimizer_states = bool(fp32_optimizer_states)
        self._pool = ThreadPoolExecutor(self.num_threads) if self.num_threads > 1 else None
        #: engine-set for the next step: every gradient times this (unscaling and clipping fused
        #: into the update, so the host never makes a pass of its own over the gradients)
        self.grad_factor = 1.0
        #: engine-set: called as ``on_chunk(param, start, end)`` in order, as each chunk's update
        #: (and its copy) is written, so the copy back to the device can start chunk by chunk
        self.on_chunk = None
        #: engine-set: ``chunk_priority(param, start, end)`` -> a number; chunks run lowest first
        #: (the first layers' chunks first, across parameters); a parameter's own chunks keep their order
        self.chunk_priority = None
        #: engine-set: where each chunk's gradient comes from instead of ``p.grad`` (which then only
        #: says the parameter has one): ``begin(spans)`` with the chunks in update order, then per
        #: chunk ``take(i)`` -> an fp32 host tensor of its length and ``done(i)``; chunks run one
        #: at a time (stages/grad_feed.py: gradients that stay on the device)
        self.grad_feed = None
        #: engine-set: where each chunk's parameter and moments come from instead of host tensors
        #: (stages/nvme_states.py: states in files): ``begin(spans)``, per chunk ``take(i)`` ->
        #: (param, exp_avg, exp_avg_sq) host views, ``done(i)``, then ``finish()``; the state
        #: dict then holds only the step count
        self.state_feed = None

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_pool", None)
        state.pop("on_chunk", None)
        state.pop("chunk_priority", None)
        state.pop("grad_feed", None)
        state.pop("state_feed", None)
        return state

    def _state_for(self, p):
        state = self.state[p]
        if not state:
            # checked here, not in __init__: an engine hands over the host masters after construction
            if p.dtype not in (torch.float32, torch.bfloat16):
                raise ValueError(f"CPUAdam updates fp32 or bf16 tensors, got {p.dtype} on {p.device}")
            # a tensor step keeps the state dict loadable by torch.optim.AdamW and back
            state["step"] = torch.zeros((), dtype=torch.float32)
            for key in MOMENTS if self.state_feed is None else ():
                state[key] = torch.zeros_like(p, dtype=self.moment_dtype(p), memory_format=torch.preserve_format)
        if state["step"].device != p.device:   # an accelerator's fused kernel takes its step there
            state["step"] = state["step"].to(p.device)
        return state

    def moment_dtype(self, p: torch.Tensor) -> torch.dtype:
        """Adam's moments of ``p``: fp32, or ``p``'s bf16 when ``fp32_optimizer_states`` is off."""
        return torch.float32 if self.fp32_optimizer_states else p.dtype

    def load_state_dict(self, state_dict):
        """torch casts floating state to its parameter's dtype; the moments take ``moment_dtype``
        instead (a bf16 parameter's fp32 moments stay fp32)."""
        ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        saved = {i: {k: v for k, v in state_dict["state"].get(i, {}).items() if k in MOMENTS} for i in ids}
        super().load_state_dict(state_dict)
        for i, p in zip(ids, [p for group in self.param_groups for p in group["params"]]):
            for key, value in saved[i].items():
                self.state[p][key] = value.to(device=p.device, dtype=self.moment_dtype(p), copy=True)

    @torch.no_grad()
    def step(self, closure=None, params_16bit=None):
        """One update of every parameter with a gradient; `params_16bit` maps param -> copy target."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.prepare_step(params_16bit)()
        return loss

    def prepare_step(self, params_16bit=None):
        """Fix this step's inputs now and return the update as a call that may run in another thread.

        Here: the step counters are advanced, and each chunk's gradient, hyper-parameters
        (``lr`` and the rest), ``grad_factor`` and ``on_chunk`` are captured, so that a scheduler,
        an engine or ``zero_grad`` may change them while the returned call runs.
        """
        jobs, spans, own, own_spans = [], [], [], []   # own: updated from p.grad where a feed serves others
        factor, self.grad_factor = self.grad_factor, 1.0
        feed = self.grad_feed
        for group in self.param_groups:
            settings = {key: value for key, value in group.items() if key != "params"}
            for p in group["params"]:
                if p.grad is None:
                    continue
                fed = feed is not None and feed.feeds(p)
                if p.grad.is_sparse and not fed:
                    raise RuntimeError("CPUAdam does not support sparse gradients")
                state = self._state_for(p)
                state["step"] += 1
                target = None if params_16bit is None else params_16bit.get(p)
                make_jobs = self._chunk_jobs if self.state_feed is None else self._state_fed_jobs
                into, into_spans = (jobs, spans) if fed or feed is None else (own, own_spans)
                into.extend(make_jobs(p, state, settings, target, factor, fed=fed))
                into_spans.extend((p, a, b) for a, b in _chunks(p.numel(), self.chunk_elements))
        if self.chunk_priority is not None:
            jobs, spans = _by_priority(jobs, spans, self.chunk_priority)
        notify = self.on_chunk
        if self.state_feed is not None:
            states = self.state_feed
            return lambda: self._run_state_fed(jobs, spans, notify, feed, states)
        return lambda: (self._run(own, own_spans, notify), self._run(jobs, spans, notify, feed))

    def _chunk_jobs(self, p, state, group, target, factor, fed: bool = False):
        """One job per chunk; ``fed``: the gradient comes from the feed when the job runs (None here)."""
        flat = [t.detach().view(-1) for t in (p, state["exp_avg"], state["exp_avg_sq"])]
        grad = None if fed else p.grad.detach().view(-1)
        out = None if target is None else target.detach().view(-1)
        step = float(state["step"])
        step_tensor = state["step"]
        return [((flat[0][a:b], None if grad is None else grad[a:b], flat[1][a:b], flat[2][a:b]),
                 None if out is None else out[a:b], step, step_tensor, group, factor)
                for a, b in _chunks(p.numel(), self.chunk_elements)]

    def _state_fed_jobs(self, p, state, group, target, factor, fed: bool = False):
        """``_chunk_jobs`` for a ``state_feed``: the chunk's parameter and moments come when the job runs."""
        grad = None if fed else p.grad.detach().view(-1)
        out = None if target is None else target.detach().view(-1)
        return [((None, None if grad is None else grad[a:b], None, None), None if out is None else out[a:b],
                 float(state["step"]), state["step"], group, factor)
                for a, b in _chunks(p.numel(), self.chunk_elements)]

    def _run_state_fed(self, jobs, spans, notify, feed, states):
        """One chunk at a time: its states (and gradient, with a grad feed) taken just before."""
        if feed is not None:
            feed.begin(spans)
        states.begin(spans)
        try:
            for index, ((_, grad, _, _), *rest) in enumerate(jobs):
                param, exp_avg, exp_avg_sq = states.take(index)
                self._step_chunk((param, feed.take(index) if feed is not None else grad, exp_avg, exp_avg_sq),
                                 *rest)
                if feed is not None:
                    feed.done(index)
                states.done(index)
                if notify is not None:
                    notify(*spans[index])
        except BaseException:
            states.abandon()
            raise
        states.finish()

    def _run(self, jobs, spans, notify, feed=None):
        if feed is not None:   # one chunk at a time, each gradient taken from the feed just before
            feed.begin(spans)
            for index, ((param, _, exp_avg, exp_avg_sq), *rest) in enumerate(jobs):
                self._step_chunk((param, feed.take(index), exp_avg, exp_avg_sq), *rest)
                feed.done(index)
                if notify is not None:
                    notify(*spans[index])
            return
        if self._pool is None or len(jobs) == 1:
            for job, span in zip(jobs, spans):
                self._step_chunk(*job)
                if notify is not None:
                    notify(*span)
            return
        for future, span in zip([self._pool.submit(self._step_chunk, *job) for job in jobs], spans):
            future.result()
            if notify is not None:
                notify(*span)

    @torch.no_grad()   # grad mode is per thread: the pool's threads need it too
    def _step_chunk(self, tensors, out, step, step_tensor, group, factor):
        fused = self.use_fused and group["bias_correction"]
        if all(t.dtype == torch.float32 for t in tensors) or (fused and len({t.dtype for t in tensors}) == 1):
            self._update(tensors, step, step_tensor, group, factor)   # in place (the fused kernel reads bf16 in fp32)
        else:
            # bf16 weights beside fp32 moments or gradients: fp32 arithmetic on the values read, each
            # result rounded to nearest even into its own tensor, as DeepSpeed's CPU Adam stores them
            wide = [t.float() for t in tensors]
            self._update(wide, step, step_tensor, group, factor)
            for narrow, result in zip(tensors, wide):
                if result is not narrow and narrow is not tensors[1]:   # the gradient is only read
                    narrow.copy_(result)
        if out is not None:
            out.copy_(tensors[0])

    def _update(self, tensors, step, step_tensor, group, factor):
        """One Adam(W) update in place of the chunk's (param, grad, exp_avg, exp_avg_sq)."""
        param, grad, exp_avg, exp_avg_sq = tensors
        beta1, beta2 = group["betas"]
        lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
        if self.use_fused and group["bias_correction"]:
            fused = torch._fused_adamw_ if group["adamw_mode"] else torch._fused_adam_
            # the kernel divides each gradient by grad_scale as it reads it
            scale = {} if factor == 1.0 else {"grad_scale": torch.tensor(1.0 / factor, device=param.device),
                                              "found_inf": torch.zeros((), device=param.device)}
            fused([param], [grad], [exp_avg], [exp_avg_sq], [], [step_tensor], lr=float(lr), beta1=beta1,
                  beta2=beta2, weight_decay=wd, eps=eps, amsgrad=False, maximize=False, **scale)
        else:
            if factor != 1.0:
                grad = grad * factor
            _step_reference(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, wd,
                            group["adamw_mode"], group["bias_correction"])


def _by_priority(jobs, spans, priority):
    """Jobs and spans sorted by priority; within one parameter never before its previous chunk."""
    keys, running = [], {}
    for param, start, end in spans:
        key = max(priority(param, start, end), running.get(id(param), float("-inf")))
        running[id(param)] = key
        keys.append(key)
    order = sorted(range(len(jobs)), key=keys.__getitem__)   # stable: ties keep their order
    return [jobs[i] for i in order], [spans[i] for i in order]


def adam_step_flat(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                   step: int, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                   adamw_mode: bool = True) -> None:
    """One Adam(W) update of flat fp32 CPU buffers in place, single-threaded reference arithmetic."""
    _step_reference(param.view(-1), grad.view(-1), exp_avg.view(-1), exp_avg_sq.view(-1), step, lr,
                    betas[0], betas[1], eps, weight_decay, adamw_mode, True)
