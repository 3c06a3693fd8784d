"""The optimizer step makes the fewest passes over parameter-sized tensors its arithmetic needs
(issue 39; engine/optimizer_step.py says why in this order). With 16-bit gradients, fp32 masters
and torch's fused AdamW on the device (the GPU's path; fused runs on the CPU too), a step is:
the norm of the 16-bit gradients (2 bytes an element), their cast to fp32 divided by the step's
factor (2 + 4), the fused AdamW without a ``grad_scale`` (reads param, grad and two moments,
writes three: 28) and the masters into the 16-bit parameters (4 + 2): 42 bytes a parameter;
stage 3 also zeroes its gradient shards (2: 44), stages 0-2 copy the next step's first gradient
over theirs instead. Before, the cast was a pass of its own, the kernel divided and wrote back
the fp32 gradients, and every stage zeroed: 50. A pass that comes back changes the figure here.
Counted with a dispatch mode on the CPU (one rank, gloo); no timing."""
import importlib.util
import pathlib
import sys

import pytest
import torch

from launcher import zero

SCRIPT = pathlib.Path(__file__).resolve().parents[3] / "scripts" / "step_census.py"


def census_module():
    """scripts/step_census.py, whose byte accounting (``StepCensus``, ``param_sized``) this test counts with."""
    spec = importlib.util.spec_from_file_location("step_census_for_tests", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def no_process_group_left():
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


PRECISIONS = {"bf16": {"bf16": {"enabled": True}},
              "bf16 sync-free": {"bf16": {"enabled": True, "check_grad_overflow": False}},
              "fp16": {"fp16": {"enabled": True, "initial_scale_power": 8}}}
#: stages 0-2 copy a step's first gradient over the buffer (no zeroing pass); stage 3 zeroes its shards
PASSES = {0: (["linalg_vector_norm", "div", "_fused_adamw_", "copy_"], 42),
          1: (["linalg_vector_norm", "div", "_fused_adamw_", "copy_"], 42),
          2: (["linalg_vector_norm", "div", "_fused_adamw_", "copy_"], 42),
          3: (["linalg_vector_norm", "div", "_fused_adamw_", "copy_", "zero_"], 44)}


def step_passes(stage: int, precision: str):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 64))
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 0.05, **PRECISIONS[precision],
              "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1, "fused": True}}}
    numel = sum(p.numel() for p in model.parameters())   # before stage 3 partitions them
    engine, *_ = zero.initialize(model=model, config=config)
    dtype = next(engine.module.parameters()).dtype
    census = census_module()
    for _ in range(2):   # the second step is counted (the first builds the optimizer's state)
        engine.backward(engine(torch.randn(4, 64).to(dtype)).float().pow(2).mean())
        counted = census.StepCensus()
        with counted:
            engine.step()
    passes = census.param_sized(counted.records, numel)
    return [r.name for r in passes], sum(r.read + r.written for r in passes) / numel


@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_16_bit_step_makes_the_fewest_param_sized_passes(stage, precision):
    names, bytes_per_param = step_passes(stage, precision)
    expected_names, expected_bytes = PASSES[stage]
    assert names == expected_names
    assert bytes_per_param == pytest.approx(expected_bytes, abs=0.5)   # padding adds a little
