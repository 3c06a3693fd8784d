"""Rank-side checks of precision, overflow handling, optimizers, data and memory, in one world.

Prints ``RESULT {json}`` records (one per check) from every rank; the test compares them.
"""
import json
import os

import torch
import torch.distributed as dist

from launcher import zero
from launcher.zero.errors import ConfigError

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def emit(name, **values):
    print("RESULT " + json.dumps({"check": name, "rank": RANK, **values}), flush=True)


def model(width=8, depth=2, seed=0):
    torch.manual_seed(seed)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers)


def same_on_all_ranks(tensor):
    gathered = [torch.zeros_like(tensor) for _ in range(WORLD)]
    dist.all_gather(gathered, tensor.contiguous())
    return all(torch.equal(gathered[0], other) for other in gathered)


def flat(m):
    return torch.cat([p.detach().float().flatten() for p in m.parameters()])


def overflow_check(stage):
    """fp16: an inf on rank 1 only skips the step on every rank; the scale halves; lr stays."""
    m = model()
    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage, "reduce_bucket_size": 20},
              "fp16": {"enabled": True, "initial_scale_power": 8, "hysteresis": 1, "loss_scale_window": 100},
              "optimizer": {"type": "Adam", "params": {"lr": 0.01}},
              "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.01, "warmup_num_steps": 10, "warmup_type": "linear"}}}
    engine, _, _, _ = zero.initialize(model=m, config=config)
    scales, lrs, skipped = [], [], []
    before = None
    for step in range(4):
        x = torch.randn(2, 8, dtype=torch.float16)
        if step == 2 and RANK == 1:
            x[0, 0] = float("inf")
        before = flat(m) if step == 2 else before
        engine.backward(engine(x).float().pow(2).mean())
        engine.step()
        if step == 2:
            unchanged = torch.equal(before, flat(m))
        scales.append(engine.get_loss_scale())
        lrs.append(engine.get_lr()[0])
        skipped.append(engine.skipped_steps)
    emit(f"overflow_stage{stage}", scales=scales, lrs=lrs, skipped=skipped, unchanged=unchanged,
         global_steps=engine.global_steps, same=same_on_all_ranks(flat(m)), loss_scale_config=engine.loss_scale(),
         dtype=str(next(m.parameters()).dtype))


def nan_loss_check():
    """fp32: a NaN loss skips the step (and the progress output names the step)."""
    m = model()
    engine, _, _, _ = zero.initialize(model=m, config={"train_micro_batch_size_per_gpu": 1, "steps_per_print": 1,
                                                      "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})
    before = flat(m)
    engine.backward(engine(torch.randn(1, 8)).sum() * float("nan"))
    engine.step()
    emit("nan_loss", skipped=engine.skipped_steps, unchanged=torch.equal(before, flat(m)), applied=engine.was_step_applied())


def memory_check(stage):
    """bf16 + Adam: bytes per parameter against the ZeRO paper's 4+12/N (stage 1) and 2+14/N (stage 2)."""
    m = model(width=64, depth=4)
    engine, _, _, _ = zero.initialize(model=m, config={
        "train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True}, "zero_optimization": {"stage": stage},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})
    for _ in range(2):
        engine.backward(engine(torch.randn(2, 64, dtype=torch.bfloat16)).float().pow(2).mean())
        engine.step()
    numel = sum(p.numel() for p in m.parameters())
    breakdown = engine.memory_breakdown()
    emit(f"memory_stage{stage}", numel=numel, breakdown=breakdown, per_param=breakdown["total"] / numel,
         param_dtype=str(next(m.parameters()).dtype), master_dtype=str(engine.optimizer.param_groups[0]["params"][0].dtype))


def optimizer_checks():
    m = model()
    try:
        zero.initialize(model=m, config={"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1},
                                         "optimizer": {"type": "Lamb", "params": {"lr": 0.01}}})
        refused = False
    except ConfigError as error:
        refused = "zero_allow_untested_optimizer" in error.hint
    losses = []
    m = model()
    engine, opt, _, sched = zero.initialize(
        model=m, config={"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 1},
                         "zero_allow_untested_optimizer": True, "optimizer": {"type": "lamb", "params": {"lr": 0.02}}})
    target = torch.randn(4, 8, generator=torch.Generator().manual_seed(3))
    for _ in range(5):
        loss = (engine(torch.ones(4, 8)) - target).pow(2).mean()
        losses.append(loss.item())
        engine.backward(loss)
        engine.step()
    lamb = opt.optimizer   # the client optimizer inside the ZeRO optimizer initialize returns, as in DeepSpeed
    emit("lamb", refused=refused, losses=losses, type=type(lamb).__name__, coeffs=lamb.get_lamb_coeffs())

    m = model()
    built = {}
    engine, opt, _, sched = zero.initialize(
        model=m, config={"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2},
                         "zero_allow_untested_optimizer": True},
        optimizer=lambda params: built.setdefault("opt", torch.optim.SGD(params, lr=0.5, momentum=0.9)),
        lr_scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5))
    for _ in range(2):
        engine.backward(engine(torch.ones(1, 8)).sum())
        engine.step()
    # initialize returns the ZeRO optimizer around the client's (as DeepSpeed does); the scheduler got the client's
    emit("client_callables", same_object=opt.optimizer is built["opt"] and sched.optimizer is built["opt"],
         lr=engine.get_lr()[0], same=same_on_all_ranks(flat(m)))


class Indexed(torch.utils.data.Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, index):
        return torch.tensor([float(index)])


def dataloader_check():
    m = model()
    _, _, loader, _ = zero.initialize(model=m, training_data=Indexed(), config={
        "train_batch_size": 4 * WORLD, "optimizer": {"type": "AdamW", "params": {}}})
    seen = [int(v) for batch in loader for v in batch.flatten().tolist()]
    emit("dataloader", batches=len(loader), batch_size=loader.batch_size, seen=seen)


class LocalAdam(torch.optim.AdamW):
    handles_gradient_communication = True


def own_communication_check():
    """An optimizer that communicates itself (1-bit Adam) gets local, unreduced gradients."""
    m = model()
    engine, opt, _, _ = zero.initialize(model=m, optimizer=LocalAdam(m.parameters(), lr=0.0),
                                        config={"train_micro_batch_size_per_gpu": 1})
    engine.backward(engine(torch.full((1, 8), float(RANK + 1))).sum())
    engine.strategy.prepare_master_grads()
    grad = engine.optimizer.param_groups[0]["params"][0].grad.clone()
    engine.step()
    emit("own_communication", grads_differ=not same_on_all_ranks(grad))


def monitor_check():
    """csv_monitor files, the steps_per_print line with wall_clock_breakdown; bf16 with fp32 communication."""
    import contextlib
    import io

    folder = os.environ["FEATURES_DIR"]
    m = model()
    engine, _, _, _ = zero.initialize(model=m, config={
        "train_micro_batch_size_per_gpu": 2, "steps_per_print": 2, "wall_clock_breakdown": True,
        "bf16": {"enabled": True}, "communication_data_type": "fp32", "zero_optimization": {"stage": 2},
        "csv_monitor": {"enabled": True, "output_path": folder, "job_name": "job"},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}})
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        engine.monitor.out = out
        for _ in range(4):
            engine.backward(engine(torch.randn(2, 8, dtype=torch.bfloat16)).float().pow(2).mean())
            engine.step()
    emit("monitor", lines=out.getvalue().splitlines(), same=same_on_all_ranks(flat(m)),
         comm_dtype=str(engine.precision.comm_dtype))


def bf16_accumulation_check(stage):
    """bf16 weights with fp32 gradient accumulation (grads cannot be views then) still train in step."""
    m = model()
    engine, _, _, _ = zero.initialize(model=m, config={
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "bf16": {"enabled": True},
        "data_types": {"grad_accum_dtype": "fp32"}, "zero_optimization": {"stage": stage, "reduce_bucket_size": 30},
        "optimizer": {"type": "AdamW", "params": {"lr": 2e-2}}})
    target = torch.randn(2, 8, generator=torch.Generator().manual_seed(4)).bfloat16()
    losses = []
    for _ in range(12):
        loss = (engine(torch.ones(2, 8, dtype=torch.bfloat16)) - target).float().pow(2).mean()
        losses.append(loss.item())
        engine.backward(loss)
        engine.step()
    emit(f"bf16_accum_stage{stage}", first=losses[0], last=losses[-1], steps=engine.global_steps,
         same=same_on_all_ranks(flat(m)), dtype=str(next(m.parameters()).dtype))


def main():
    for stage in (1, 2):
        overflow_check(stage)
    nan_loss_check()
    for stage in (1, 2):
        memory_check(stage)
    optimizer_checks()
    dataloader_check()
    own_communication_check()
    monitor_check()
    for stage in (0, 1, 2):
        bf16_accumulation_check(stage)


if __name__ == "__main__":
    main()
