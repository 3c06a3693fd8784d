"""Two-rank cases of tests/dist/test_deepspeed_calls_ranks.py: ``no_sync STAGE``, ``returned_param``,
``pipe_eval`` (two pipeline stages) and ``fragments STAGE``.

Each rank prints one ``RESULT {json}`` line: the final parameters (no_sync), every step's loss
(returned_param), what eval_batch returned on this stage (pipe_eval), or each parameter's full fp32
master and Adam state as deepspeed.utils' tensor-fragment functions read them (fragments).
"""
import json
import os
import sys

import torch

from launcher import zero

RANK, WORLD_SIZE = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def no_sync(stage: int) -> dict:
    """Each step: a micro-batch inside engine.no_sync(), then one outside and engine.step()."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.0, "zero_optimization": {"stage": stage},
              "optimizer": {"type": "AdamW", "params": {"lr": 0.1}}}
    engine, *_ = zero.initialize(model=model, config=config)
    data = torch.randn(3, 2, WORLD_SIZE, 2, 4, generator=torch.Generator().manual_seed(1))
    for step in range(3):
        with engine.no_sync():
            engine.backward(engine(data[step, 0, RANK]).pow(2).mean())
        engine.backward(engine(data[step, 1, RANK]).pow(2).mean())
        engine.step()
    return {"params": [p.detach().flatten().tolist() for p in engine.module.parameters()]}


def returned_param() -> dict:
    """Stage 3 on real shards: an embedding returns its weight, the head multiplies by it."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    from tests.unit.zero.test_deepspeed_calls import TiedThroughOutputs, cross_entropy

    torch.manual_seed(0)
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.0,
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
              "optimizer": {"type": "AdamW", "params": {"lr": 0.1}}}
    engine, *_ = zero.initialize(model=TiedThroughOutputs(), config=config)
    ids = torch.randint(0, 16, (3, WORLD_SIZE, 2, 5), generator=torch.Generator().manual_seed(1))
    losses = []
    for step in range(3):
        loss = cross_entropy(engine(ids[step, RANK]), ids[step, RANK])
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return {"losses": losses, "released": engine.module.embed.weight.numel() == 0}


def pipe_eval() -> dict:
    """A two-stage PipelineModule without loss_fn: eval_batch's mean output on both stages."""
    from launcher.zero.pipe import LayerSpec, PipelineModule

    torch.manual_seed(0)
    module = PipelineModule([LayerSpec(torch.nn.Linear, 3, 4), LayerSpec(torch.nn.Linear, 4, 2)], num_stages=2,
                            loss_fn=None)
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
              "optimizer": {"type": "AdamW", "params": {"lr": 0.1}}}
    engine, *_ = zero.initialize(model=module, config=config)
    generator = torch.Generator().manual_seed(1)
    data = [(torch.randn(2, 3, generator=generator), torch.randn(2, 2, generator=generator)) for _ in range(2)]
    mean, logits = engine.eval_batch(iter(data), return_logits=True)
    each = engine.eval_batch(iter(data), reduce_output=None, bcast_loss=False)
    return {"mean": mean.tolist(), "dtype": str(mean.dtype), "logits": None if logits is None else logits.tolist(),
            "each": None if each is None else [value.tolist() for value in each]}


def fragments(stage: int) -> dict:
    """Two steps of the no_sync case's model without no_sync, then the safe_get_full_* of each parameter."""
    from launcher.zero.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state, safe_get_local_fp32_param

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.0,
              "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 3},
              "optimizer": {"type": "AdamW", "params": {"lr": 0.1}}}
    engine, *_ = zero.initialize(model=model, config=config)
    data = torch.randn(2, WORLD_SIZE, 2, 4, generator=torch.Generator().manual_seed(1))
    for step in range(2):
        engine.backward(engine(data[step, RANK]).pow(2).mean())
        engine.step()
    params = list(engine.module.parameters())
    local = [safe_get_local_fp32_param(p).numel() for p in params] if stage == 3 else []
    return {"params": [safe_get_full_fp32_param(p).flatten().tolist() for p in params],
            "exp_avg": [safe_get_full_optimizer_state(p, "exp_avg").flatten().tolist() for p in params],
            "local_numel": local}


if __name__ == "__main__":
    case, args = sys.argv[1], [int(arg) for arg in sys.argv[2:]]
    result = {"no_sync": no_sync, "returned_param": returned_param, "pipe_eval": pipe_eval,
              "fragments": fragments}[case](*args)
    print("RESULT " + json.dumps(result), flush=True)
