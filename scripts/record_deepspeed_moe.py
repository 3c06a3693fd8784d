"""Record real DeepSpeed 0.19.8 MoE behaviour as test data (run with DeepSpeed's interpreter, not ours).

    PYTHONPATH=. /work/dsref/bin/python scripts/record_deepspeed_moe.py [out_dir]

Writes, into ``tests/data/deepspeed-0.19.8/`` by default:

* ``moe_layer.json``: for every case of ``tests.helpers.moe_cases.LAYER_CASES``, DeepSpeed's MoE
  layer's initial weights (digests), outputs, ``l_aux``, ``exp_counts`` (two forwards) and gradients;
* ``moe_cifar.json``: per-step losses, learning rates and final weights (digests) of the CIFAR-10
  tutorial's network (``--moe`` options of ``TUTORIAL_RUNS``) trained by ``deepspeed.initialize``
  with ``TUTORIAL_CONFIG`` on one CPU rank, with the tutorial's ``--moe-param-group`` groups.

Our tests compare our layer and training against these files; they never import DeepSpeed.
"""
import json
import os
import sys
from pathlib import Path

import numpy
import torch

from tests.helpers import moe_cases


def shortest(value):
    """Floats written with the fewest digits that read back as the same float32 (halves the file)."""
    if isinstance(value, float):
        return float(str(numpy.float32(value)))
    if isinstance(value, dict):
        return {key: shortest(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shortest(item) for item in value]
    return value


def digest(tensor) -> dict:
    """A parameter's sum, L2 norm (float64) and first values: enough to see two trainings part."""
    values = tensor.detach().double().flatten()
    return {"sum": float(values.sum()), "norm": float(values.norm()), "head": values[:4].tolist()}


def init_single_rank():
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29671"))
    import deepspeed
    deepspeed.init_distributed(dist_backend="gloo")
    return deepspeed


def record_layers(MoE) -> list:
    cases = []
    for case in moe_cases.LAYER_CASES:
        result = moe_cases.run_layer_case(MoE, case)
        result["initial"] = {name: digest(torch.tensor(values)) for name, values in result["initial"].items()}
        cases.append({"case": case, **shortest(result)})
        print("layer case", case["name"], "exp_counts", [f["exp_counts"] for f in cases[-1]["forwards"]])
    return cases


def record_tutorial(deepspeed, MoE, split, run: dict) -> dict:
    net = moe_cases.tutorial_net(MoE, run)
    groups = moe_cases.moe_param_groups(net, split)
    config = json.loads(json.dumps(moe_cases.TUTORIAL_CONFIG))
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=groups, config=config)
    criterion = torch.nn.CrossEntropyLoss()
    losses, lrs = [], []
    torch.manual_seed(moe_cases.TUTORIAL_SEED + 1)   # the gates' draws during training
    for images, labels in moe_cases.synthetic_cifar(moe_cases.TUTORIAL_STEPS, moe_cases.TUTORIAL_BATCH):
        loss = criterion(engine(images), labels)
        engine.backward(loss)
        lrs.append(engine.get_lr()[0])
        engine.step()
        losses.append(loss.item())
    print("tutorial run", run["name"], "losses", [round(x, 4) for x in losses])
    return {"run": run, "losses": losses, "lrs": lrs,
            "param_groups": [{"name": g["name"], "moe": g.get("moe", False), "size": len(g["params"])}
                             for g in engine.optimizer.param_groups],
            "final": {name: digest(p) for name, p in net.named_parameters()}}


def main():
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/data/deepspeed-0.19.8")
    out_dir.mkdir(parents=True, exist_ok=True)
    deepspeed = init_single_rank()
    from deepspeed.moe.layer import MoE
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer as split
    versions = {"deepspeed": deepspeed.__version__, "torch": torch.__version__}
    layers = {**versions, "cases": record_layers(MoE)}
    (out_dir / "moe_layer.json").write_text(json.dumps(layers))
    tutorial = {**versions, "config": moe_cases.TUTORIAL_CONFIG, "steps": moe_cases.TUTORIAL_STEPS,
                "batch_size": moe_cases.TUTORIAL_BATCH,
                "runs": [record_tutorial(deepspeed, MoE, split, run) for run in moe_cases.TUTORIAL_RUNS]}
    (out_dir / "moe_cifar.json").write_text(json.dumps(tutorial))
    print("wrote", out_dir / "moe_layer.json", out_dir / "moe_cifar.json")


if __name__ == "__main__":
    main()
