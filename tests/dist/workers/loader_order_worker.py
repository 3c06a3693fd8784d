"""Which samples ``deepspeed.initialize(training_data=...)``'s loader gives this rank, batch by batch (issue 30).

Written as a DeepSpeed script (``import deepspeed``): it runs unchanged under a real DeepSpeed and
under ``dslaunch --as-deepspeed``. Every sample carries its own index, so a batch is a list of indices.

    loader_order_worker.py engine SAMPLES MICRO GAS DROP_LAST    the engine's loader: two passes, then
                                                                  data_sampler.set_epoch(3) and a third
    loader_order_worker.py pipe SAMPLES MICRO GAS STAGES          the pipeline engine's loader: 3 epochs' worth,
                                                                  as one endless stream

Each rank prints ``RESULT {"rank", "passes": [[[index, ...], ...], ...]}`` and, given ``--out DIR``,
writes the same to DIR/rank<R>.json. What differs from DeepSpeed's loader in kind (no ``data_sampler``,
a pipeline loader that ends) is printed as ``RESULT_ERROR ...`` and the rest still collected.
"""
import json
import os
import sys
from pathlib import Path

import deepspeed
import torch
from torch.utils.data import Dataset

RANK = int(os.environ["RANK"])


class Indexed(Dataset):
    def __init__(self, count: int):
        self.count = count

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        return torch.full((2,), float(index)), torch.tensor(index)


def ids(batch) -> list[int]:
    return batch[1].tolist()


def engine_passes(samples, micro, gas, drop_last):
    model = torch.nn.Linear(2, 1)
    config = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": gas,
              "dataloader_drop_last": drop_last}
    _, _, loader, _ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                           config=config, training_data=Indexed(samples))
    passes = [[ids(b) for b in loader] for _ in range(2)]
    try:
        sampler = loader.data_sampler
    except AttributeError as error:   # reported, so that the first two passes still come back
        print(f"RESULT_ERROR {type(error).__name__}: {error}", flush=True)
        return passes
    sampler.set_epoch(3)
    passes.append([ids(b) for b in loader])
    return passes


def pipe_passes(samples, micro, gas, stages):
    from deepspeed.pipe import PipelineModule

    deepspeed.init_distributed()   # PipelineModule needs the process group (DeepSpeed's pipeline tutorial)
    module = PipelineModule(layers=[torch.nn.Linear(2, 2) for _ in range(stages)], num_stages=stages,
                            loss_fn=torch.nn.functional.mse_loss)
    config = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": gas,
              "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}}
    _, _, loader, _ = deepspeed.initialize(model=module, model_parameters=module.parameters(), config=config,
                                           training_data=Indexed(samples))
    dp_world = torch.distributed.get_world_size() // stages
    per_epoch = -(-samples // dp_world // micro)
    batches, stream = [], iter(loader)
    while len(batches) < 3 * per_epoch:
        try:
            batches.append(ids(next(stream)))
        except StopIteration:   # DeepSpeed's RepeatingLoader never ends; a plain loader is started again
            print("RESULT_ERROR the pipeline loader ended after one pass (DeepSpeed's repeats)", flush=True)
            stream = iter(loader)
    return [batches[e * per_epoch:(e + 1) * per_epoch] for e in range(3)]


def main(argv):
    out = None
    if "--out" in argv:
        at = argv.index("--out")
        out, argv = argv[at + 1], argv[:at] + argv[at + 2:]
    kind, samples, micro, gas, last = argv[0], *map(int, argv[1:5])
    passes = engine_passes(samples, micro, gas, bool(last)) if kind == "engine" else pipe_passes(samples, micro, gas, last)
    record = {"rank": RANK, "passes": passes}
    print("RESULT " + json.dumps(record), flush=True)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"rank{RANK}.json").write_text(json.dumps(record))
    # a first pipeline stage is done long before the last one; leaving then can cut the last stage's
    # process-group set-up short (gloo: "Connection closed by peer"), so every rank leaves together
    torch.distributed.barrier()


if __name__ == "__main__":
    main(sys.argv[1:])
