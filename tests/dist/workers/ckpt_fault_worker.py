"""save: a checkpoint 'a', one more step, then a second save (tag 'b', or 'a' again) killed at the
FAULT_AT-th file operation of save_checkpoint (os._exit, as SIGKILL: no cleanup); each save's
weights are recorded first under REF_DIR. load: resume from 'latest' and say which save it got."""
import os
import shutil
import sys

import torch

from launcher import zero

ckpt_dir, ref_dir, mode, second_tag = sys.argv[1:5]
fault_at = int(os.environ.get("FAULT_AT", "0"))


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    engine, _, _, _ = zero.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.05}}})
    return engine


def train_step(engine):
    engine.backward(engine(torch.ones(4, 8)).pow(2).mean())
    engine.step()


def weights(engine):
    return torch.cat([p.detach().float().view(-1).cpu() for p in engine.module.parameters()])


def kill_at_the_nth_file_operation(n):
    count = [0]

    def wrap(function):
        def wrapped(*args, **kwargs):
            count[0] += 1
            if count[0] == n:
                os._exit(137)
            return function(*args, **kwargs)
        return wrapped
    for module, name in ((os, "replace"), (os, "makedirs"), (os, "fsync"), (shutil, "rmtree"), (torch, "save")):
        setattr(module, name, wrap(getattr(module, name)))


engine = build()
if mode == "save":
    train_step(engine)
    torch.save(weights(engine), os.path.join(ref_dir, "first.pt"))
    engine.save_checkpoint(ckpt_dir, tag="a")
    train_step(engine)
    torch.save(weights(engine), os.path.join(ref_dir, "second.pt"))
    if fault_at:
        kill_at_the_nth_file_operation(fault_at)
    engine.save_checkpoint(ckpt_dir, tag=second_tag)
    print("saved", flush=True)
else:
    path, _ = engine.load_checkpoint(ckpt_dir)
    got = weights(engine)
    which = [name for name in ("first", "second") if torch.equal(got, torch.load(os.path.join(ref_dir, name + ".pt")))]
    print(f"loaded {os.path.basename(path)} {which}", flush=True)
    train_step(engine)   # and training goes on from it
    print("resumed", flush=True)
