"""An out-of-memory error inside the engine comes back with the memory estimate."""
import json

OUT_OF_MEMORY = "CUDA out of memory. Tried to allocate 20.00 GiB"


def main():
    import torch
    from launcher import zero

    class Hungry(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(64, 64)

        def forward(self, x):
            raise getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)(OUT_OF_MEMORY)

    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    engine, _, _, _ = zero.initialize(model=Hungry(), config=config)
    try:
        engine(torch.zeros(1, 64))
    except Exception as error:  # noqa: BLE001 - the test reports whatever came out
        print("RESULT " + json.dumps({"type": type(error).__name__, "message": str(error)}), flush=True)


def test_out_of_memory_is_reraised_with_the_estimate():
    from tests.helpers.world import check, run_world
    record = check(run_world(__file__, 1))[0].records()[0]
    assert record["type"] == "OutOfMemoryError"
    assert OUT_OF_MEMORY in record["message"]
    assert "[zero] model states need about" in record["message"]


if __name__ == "__main__":
    main()
