"""Two-rank cases of tests/dist/test_deepspeed_calls_ranks.py: ``pipe_eval`` (two pipeline stages).

Each rank prints one ``RESULT {json}`` line: what eval_batch returned on this stage.
"""
import json
import sys

import torch

from launcher import zero


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


if __name__ == "__main__":
    result = {"pipe_eval": pipe_eval}[sys.argv[1]]()
    print("RESULT " + json.dumps(result), flush=True)
