"""Stage 3's parameter coordinator on one rank (gloo, in this process): each module's partitioned
parameters are worked out once at install, not per hook or per prefetch step, and the prefetch
still starts the same all-gathers in the same order as the full rescan it replaced (the expected
orders below are what the rescanning coordinator produced)."""
import pytest
import torch
import torch.nn as nn

from launcher import zero
from launcher.zero.stages.stage3 import coordinator as C
from launcher.zero.stages.stage3 import params as P


@pytest.fixture(autouse=True)
def no_process_group_left():
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


class Scale(nn.Module):
    """``x * w``: autograd saves the parameter itself, so backward unpacks (and prefetches) it."""

    def __init__(self, n):
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, n))

    def forward(self, x):
        return x * self.w


class Net(nn.Module):
    """Trace: inp, s1, mid, s2, mid, out (``mid`` runs twice, ``s2`` in between)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(4, 8)      # 40 elements
        self.s1 = Scale(8)              # 8
        self.mid = nn.Linear(8, 8)      # 72
        self.s2 = Scale(8)              # 8
        self.out = nn.Linear(8, 2)      # 18

    def forward(self, x):
        h = self.s1(torch.tanh(self.inp(x)))
        h = self.s2(torch.tanh(self.mid(h)))
        h = torch.tanh(self.mid(h))
        return self.out(h)


def build(**zero_keys):
    torch.manual_seed(0)
    model = Net()
    engine, _, _, _ = zero.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": 2,
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, **zero_keys},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})
    return model, engine


def train_step(engine, x):
    engine.backward(engine(x).pow(2).mean())
    engine.step()


def test_partitioned_params_are_not_recomputed_per_hook_or_prefetch(monkeypatch):
    model, engine = build(stage3_max_reuse_distance=0)
    calls = {"own": 0, "parameters": 0}
    own_partitioned, parameters = C._own_partitioned, nn.Module.parameters

    def counting_own(module):
        calls["own"] += 1
        return own_partitioned(module)

    def counting_parameters(self, recurse=True):
        calls["parameters"] += not recurse
        return parameters(self, recurse)

    monkeypatch.setattr(C, "_own_partitioned", counting_own)
    monkeypatch.setattr(nn.Module, "parameters", counting_parameters)
    x = torch.randn(2, 4)
    for _ in range(3):      # the recording step, then two that prefetch forward and backward
        train_step(engine, x)
    assert calls == {"own": 0, "parameters": 0}
    coordinator = engine.strategy.coordinator
    assert coordinator.recorded and len(coordinator.trace) == 6
    engine.destroy()


def test_a_changed_parameter_is_seen_by_the_cache():
    model, engine = build()
    coordinator = engine.strategy.coordinator
    weight, bias = model.out.weight, model.out.bias
    assert coordinator._own_params(model.out) == (weight, bias)
    model.out.weight = nn.Parameter(torch.zeros(2, 8))      # a whole (not partitioned) parameter
    assert coordinator._own_params(model.out) == (bias,)
    engine.destroy()


# (name, async_op) of every P.start_gather in a step's forward, then its backward
REUSE_0 = [("s1.w", True), ("mid.weight", True), ("mid.bias", True), ("s2.w", True), ("out.weight", True),
           ("out.bias", True), ("inp.weight", False), ("inp.bias", False),
           ("mid.weight", True), ("mid.bias", True),        # released after its first run, prefetched again
           "backward",
           ("mid.weight", True), ("mid.bias", True), ("s1.w", True), ("inp.weight", True), ("inp.bias", True),
           ("s2.w", False)]
BUCKET_50 = [("s1.w", True), ("mid.weight", True), ("mid.bias", True), ("inp.weight", False), ("inp.bias", False),
             ("s2.w", True), ("out.weight", True), ("out.bias", True), ("mid.weight", True), ("mid.bias", True),
             "backward",
             ("mid.weight", True), ("mid.bias", True), ("s2.w", False), ("inp.weight", True), ("inp.bias", True),
             ("s1.w", False)]
LIVE_60 = [("s1.w", True), ("inp.weight", False), ("inp.bias", False), ("s2.w", True), ("mid.weight", False),
           ("mid.bias", False), ("out.weight", False), ("out.bias", False),
           "backward",
           ("s2.w", False), ("inp.weight", True), ("inp.bias", True), ("s1.w", False)]


@pytest.mark.parametrize("zero_keys, expected", [
    ({"stage3_max_reuse_distance": 0}, REUSE_0),
    ({"stage3_prefetch_bucket_size": 50, "stage3_max_reuse_distance": 0}, BUCKET_50),
    ({"stage3_max_live_parameters": 60}, LIVE_60),
], ids=["reuse-distance-0", "bucket-50", "max-live-60"])
def test_prefetch_starts_the_same_gathers_in_the_same_order(monkeypatch, zero_keys, expected):
    model, engine = build(**zero_keys)
    names = {id(p): n for n, p in model.named_parameters()}
    x = torch.randn(2, 4)
    train_step(engine, x)          # records the order
    started = []
    start_gather = P.start_gather

    def recording(p, async_op=False):
        started.append((names[id(p)], async_op))
        return start_gather(p, async_op=async_op)

    monkeypatch.setattr(P, "start_gather", recording)
    for _ in range(2):             # the same in every step after the recording one
        loss = engine(x).pow(2).mean()
        started.append("backward")
        engine.backward(loss)
        engine.step()
        started.append("step")
    assert started == 2 * (expected + ["step"])
    assert engine.strategy.coordinator.live_numel == 0
    engine.destroy()


def _forward_gathers(monkeypatch, not_ready: set[str]) -> list[str]:
    """The parameters a recorded forward gathers, in order, while ``not_ready`` are still being
    updated by a background step (``coordinator.ready`` says no for them; a gather waits)."""
    model, engine = build(stage3_max_reuse_distance=0)
    names = {id(p): n for n, p in model.named_parameters()}
    x = torch.randn(2, 4)
    train_step(engine, x)          # records the order
    engine.strategy.coordinator.ready = lambda p: names[id(p)] not in not_ready
    started = []
    start_gather = P.start_gather
    monkeypatch.setattr(P, "start_gather", lambda p, async_op=False: (
        started.append(names[id(p)]), start_gather(p, async_op=async_op))[1])
    engine(x)
    monkeypatch.setattr(P, "start_gather", start_gather)
    engine.strategy.coordinator.ready = None
    engine.destroy()
    return started


@pytest.mark.parametrize("not_ready", [{"s1.w"}, {"inp.weight", "mid.weight"}, {"inp.weight"}])
def test_gathers_keep_one_order_whatever_a_background_step_has_finished(monkeypatch, not_ready):
    """Each rank finishes overlap_step's update at its own time: the all-gathers must still come
    in one order on every rank, or gloo/NCCL pair different collectives (offload_optimizer.ratio
    made the first module's parameter ready later than the next one's on one rank: a crash)."""
    everything = _forward_gathers(monkeypatch, set())
    assert everything[:2] == ["inp.weight", "inp.bias"]   # the module's own first, then the prefetch
    assert _forward_gathers(monkeypatch, not_ready) == everything


@pytest.mark.xfail(strict=True, reason="known: a module that runs twice in one forward, its parameter "
                   "released in between (stage3_max_reuse_distance), is gathered again before or after a "
                   "later module's not-ready parameter depending on the timing")
@pytest.mark.parametrize("not_ready", [{"out.weight"}, {"s2.w"}])
def test_gathers_of_a_module_run_twice_still_depend_on_the_timing(monkeypatch, not_ready):
    assert _forward_gathers(monkeypatch, not_ready) == _forward_gathers(monkeypatch, set())
