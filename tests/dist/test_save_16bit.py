"""engine.save_16bit_model: full weights at every stage; at stage 3 only when asked to gather."""
import json
import os
from pathlib import Path


def main():
    import torch
    from launcher import zero

    folder = Path(os.environ["SAVE_DIR"])
    results = {}
    for stage, gather in ((2, False), (3, False), (3, True)):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.ReLU(), torch.nn.Linear(48, 8))
        full = {k: v.clone() for k, v in model.state_dict().items()}
        config = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                  "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0,
                                        "stage3_gather_16bit_weights_on_model_save": gather},
                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
        if stage != 3:
            del config["zero_optimization"]["stage3_param_persistence_threshold"]
            del config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"]
        engine, _, _, _ = zero.initialize(model=model, config=config)
        out = folder / f"stage{stage}-{gather}"
        saved = engine.save_16bit_model(str(out))
        entry = {"saved": saved, "exists": (out / "pytorch_model.bin").exists()}
        if entry["exists"]:
            state = torch.load(out / "pytorch_model.bin")
            entry["shapes_ok"] = all(state[k].shape == v.shape for k, v in full.items())
            entry["dtype"] = str(state["0.weight"].dtype)
            entry["error"] = max((state[k].float() - v.bfloat16().float()).abs().max().item() for k, v in full.items())
        results[f"{stage}-{gather}"] = entry
        torch.distributed.barrier()
    print("RESULT " + json.dumps(results), flush=True)


def test_save_16bit_model(tmp_path):
    from tests.helpers.world import check, run_world
    record = check(run_world(__file__, 2, env={"SAVE_DIR": str(tmp_path)}))[0].records()[0]
    assert record["2-False"]["saved"] and record["2-False"]["shapes_ok"]
    assert record["3-False"] == {"saved": False, "exists": False}  # DeepSpeed's behaviour without the flag
    assert record["3-True"]["saved"] and record["3-True"]["shapes_ok"]
    assert record["3-True"]["dtype"] == "torch.bfloat16" and record["3-True"]["error"] == 0.0


if __name__ == "__main__":
    main()
