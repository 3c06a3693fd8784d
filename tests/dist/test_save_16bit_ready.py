"""engine.save_16bit_model returns on every rank only once rank 0's file is whole: a script that
loads the file right after the call (to evaluate or upload it) must never read half of it.
Rank 0's write is slowed down on purpose, so that a rank that does not wait reads too early."""
import json
import os
import time
from pathlib import Path


def main():
    import torch
    from launcher import zero

    folder = Path(os.environ["SAVE_DIR"])
    real_save = torch.save

    def slow_save(obj, f, *args, **kwargs):   # rank 0 only: the write takes a second
        time.sleep(1.0)
        return real_save(obj, f, *args, **kwargs)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.Linear(24, 4))
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    engine, _, _, _ = zero.initialize(model=model, config=config)
    if engine.global_rank == 0:
        torch.save = slow_save
    saved = engine.save_16bit_model(str(folder))
    torch.save = real_save
    path = folder / "pytorch_model.bin"
    state = torch.load(path) if path.exists() else None   # every rank reads at once
    result = {"saved": saved, "exists": state is not None,
              "keys": sorted(state) if state is not None else [],
              "leftovers": sorted(p.name for p in folder.iterdir() if p.name != "pytorch_model.bin")}
    print("RESULT " + json.dumps(result), flush=True)


def test_every_rank_can_read_the_file_when_the_call_returns(tmp_path):
    from tests.helpers.world import check, run_world
    results = check(run_world(__file__, 2, env={"SAVE_DIR": str(tmp_path)}))
    for rank in results:
        record = rank.records()[0]
        assert record == {"saved": True, "exists": True, "leftovers": [],
                          "keys": ["0.bias", "0.weight", "1.bias", "1.weight"]}


if __name__ == "__main__":
    main()
