"""offload_optimizer.overlap_step on one rank (gloo, in this process): bf16 weights bit-identical
to the synchronous step at stages 1-3, an error of the background step raised by the next call,
and the config mistakes refused with a hint. (2-rank parity: tests/dist/test_overlap_step.py.)"""
import time

import pytest
import torch

from launcher import zero
from launcher.zero.errors import ConfigError
from launcher.zero.optim.cpu_adam import CPUAdam


@pytest.fixture(autouse=True)
def no_process_group_left():
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


class SlowAdam(CPUAdam):
    """A CPU Adam slow enough that the next forward starts while it still runs."""

    fail_at_step = None

    def _step_chunk(self, tensors, out, step, *rest):
        time.sleep(0.002)
        if step == self.fail_at_step:
            raise RuntimeError(f"host step {int(step)} failed")
        return super()._step_chunk(tensors, out, step, *rest)


def config(stage, overlap, threshold=100, **offload):
    return {"train_micro_batch_size_per_gpu": 8, "gradient_clipping": 0.05, "bf16": {"enabled": True},
            "gradient_accumulation_steps": 2, "zero_allow_untested_optimizer": True,
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": threshold,
                                  "offload_optimizer": {"device": "cpu", "overlap_step": overlap, **offload}}}


def build(stage, overlap, fail_at_step=None, threshold=100):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))

    def optimizer(params):
        adam = SlowAdam(params, lr=0.01, weight_decay=0.1, chunk_elements=96)
        adam.fail_at_step = fail_at_step
        return adam
    engine, _, _, _ = zero.initialize(model=model, optimizer=optimizer, config=config(stage, overlap, threshold))
    return engine


def micro_steps(engine, count, seed=1):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(count):
        x = torch.randn(8, 16, generator=gen).to(torch.bfloat16)
        engine.backward(engine(x).float().pow(2).mean())
        engine.step()


# stage 3 with threshold 0: every parameter partitioned (each waits as it is gathered);
# with 100 the biases stay whole (they wait as their module starts)
@pytest.mark.parametrize("stage,threshold", [(1, 100), (2, 100), (3, 100), (3, 0)])
def test_bf16_overlapped_step_gives_the_same_bits(stage, threshold):
    results = []
    for overlap in (False, True):
        engine = build(stage, overlap, threshold=threshold)
        micro_steps(engine, 8)
        results.append(engine.module_state_dict())
        engine.destroy()
    plain, overlapped = results
    assert plain.keys() == overlapped.keys()
    for key in plain:
        assert plain[key].dtype == torch.bfloat16
        assert torch.equal(plain[key], overlapped[key]), key


@pytest.mark.parametrize("stage", [2, 3])
def test_an_error_in_the_background_step_is_raised_by_the_next_call(stage):
    engine = build(stage, True, fail_at_step=2)
    micro_steps(engine, 4)    # steps 1 and 2 start; step 2 fails in the worker thread
    with pytest.raises(RuntimeError, match="host step 2 failed"):
        micro_steps(engine, 1)
    engine.destroy()


def test_overlap_step_needs_a_cpu_adam_and_belongs_to_offload_optimizer():
    model = torch.nn.Linear(4, 4)
    with pytest.raises(ConfigError, match="overlap_step needs the engine's CPU Adam") as error:
        zero.initialize(model=model, optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
                        config=config(2, True))
    assert "AdamW" in error.value.hint
    with pytest.raises(ConfigError, match="belongs to offload_optimizer"):
        cfg = config(3, False)
        cfg["zero_optimization"]["offload_param"] = {"device": "cpu", "overlap_step": True}
        zero.initialize(model=torch.nn.Linear(4, 4), optimizer=lambda params: CPUAdam(params), config=cfg)


class RecordingAdam(SlowAdam):
    """Remembers which flat master and offset each chunk it stepped came from."""

    def _step_chunk(self, tensors, *rest):
        self.stepped.append(tensors[0].data_ptr())
        return super()._step_chunk(tensors, *rest)


@pytest.mark.parametrize("stage", [2, 3])
def test_the_first_layers_are_stepped_first_across_optimizer_groups(stage):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    groups = [{"params": [model[0].weight, model[2].weight], "weight_decay": 0.1},
              {"params": [model[0].bias, model[2].bias], "weight_decay": 0.0}]
    adams = []

    def optimizer(params):
        adams.append(RecordingAdam(params, lr=0.01, chunk_elements=96))
        adams[-1].stepped = []
        return adams[-1]
    engine, _, _, _ = zero.initialize(model=model, model_parameters=groups, optimizer=optimizer,
                                      config=config(stage, True, threshold=0))
    micro_steps(engine, 2)
    engine.wait_for_step()
    weights, biases = (g["params"][0] for g in adams[0].param_groups)
    bias_chunk = adams[0].stepped.index(biases.data_ptr())
    # the decay group holds the first layer's weight, then the last layer's: the group of the
    # biases (the first layer's among them) goes between the two, not after both
    last_weight_chunk = max(i for i, ptr in enumerate(adams[0].stepped) if weights.data_ptr() <= ptr
                            < weights.data_ptr() + weights.numel() * 4)
    assert 0 < bias_chunk < last_weight_chunk, adams[0].stepped
    engine.destroy()


@pytest.mark.parametrize("stage", [2, 3])
def test_a_checkpoint_saved_right_after_step_resumes_to_the_same_bits(stage, tmp_path):
    results = []
    for overlap in (False, True):
        engine = build(stage, overlap)
        micro_steps(engine, 4)
        engine.save_checkpoint(str(tmp_path / f"ckpt{overlap}"))   # the background step still runs
        engine.destroy()
        resumed = build(stage, overlap)
        resumed.load_checkpoint(str(tmp_path / f"ckpt{overlap}"))
        micro_steps(resumed, 4, seed=2)
        results.append(resumed.module_state_dict())
        resumed.destroy()
    plain, overlapped = results
    for key in plain:
        assert torch.equal(plain[key], overlapped[key]), key


def test_a_background_step_error_fails_a_script_that_ends_right_after_step(tmp_path):
    import os
    import subprocess
    import sys

    script = tmp_path / "ends_after_step.py"
    script.write_text(
        "from tests.unit.zero.test_offload_overlap import build, micro_steps\n"
        "engine = build(2, True, fail_at_step=1)\n"
        "micro_steps(engine, 2)   # one optimizer step (2 micro steps), then the script ends\n"
        "print('script ended', flush=True)\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240,
                          cwd=root, env={**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1"})
    assert "script ended" in done.stdout
    assert done.returncode != 0, done.stderr
    assert "host step 1 failed" in done.stderr
