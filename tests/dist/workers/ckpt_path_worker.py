"""save_checkpoint / load_checkpoint with an empty or missing folder on every rank (issue 41).

``ckpt_path_worker.py STAGE DIR``: changes into DIR (so a path resolved against the working folder
lands there), trains one step, then calls ``save_checkpoint("")``, ``save_checkpoint(None)``,
``save_checkpoint`` with a folder on rank 0 and ``""`` on the others (``mixed``),
``load_checkpoint("")`` and ``load_checkpoint(None)`` in turn; each rank prints one
``RESULT {"call": ..., "error": <exception type or null>, "message": ..., "returned": ...}`` a call,
then a barrier proves the ranks are still in step.
"""
import json
import os
import sys

import torch
import torch.distributed as dist

from launcher import zero

CALLS = [("save_checkpoint", ""), ("save_checkpoint", None), ("save_checkpoint", "mixed"), ("load_checkpoint", ""),
         ("load_checkpoint", None)]


def main(stage: int, folder: str) -> None:
    os.chdir(folder)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}}
    engine, *_ = zero.initialize(model=model, config=config)
    loss = engine(torch.randn(2, 4)).square().mean()
    engine.backward(loss)
    engine.step()
    for method, path in CALLS:
        if path == "mixed":
            path = "saved" if dist.get_rank() == 0 else ""
        try:
            returned = getattr(engine, method)(path)
            record = {"call": f"{method}({path!r})", "error": None, "message": None, "returned": repr(returned)}
        except Exception as error:   # the test asserts on the type and message
            record = {"call": f"{method}({path!r})", "error": type(error).__name__,
                      "bases": [cls.__name__ for cls in type(error).__mro__], "message": str(error),
                      "hint": getattr(error, "hint", None), "returned": None}
        print("RESULT " + json.dumps(record), flush=True)
    dist.barrier()
    print("RESULT " + json.dumps({"call": "barrier", "error": None}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
