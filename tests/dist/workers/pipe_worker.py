"""Rank-side pipeline parity: PipelineModule through zero.initialize vs. single-process AdamW.

argv: num_stages schedule model gas partition_method [tensor [mode folder]]. ``schedule`` "interleaved:V" builds the
module with V virtual stages per rank. ``model`` is ``plain`` (5 layers, an
uneven split over 2 stages), ``tied`` (the first and the last layer share one weight, across
stages) or ``tp`` (3 residual MLP blocks, column- then row-parallel over ``tensor`` ranks, and a head);
``+ckpt`` adds activation checkpointing, ``+zero1`` ZeRO stage 1 over the data axis.
Prints one ``RESULT {json}`` line: the max abs weight error, the losses of both, bytes per stage.
"""
import json
import os
import sys

import torch
from torch import nn

from launcher import zero
from launcher.zero.parallel.grid import ParallelGrid
from launcher.zero.parallel.tensor import ColumnParallelLinear, RowParallelLinear
from launcher.zero.parallel.topology import PipeModelDataParallelTopology
from launcher.zero.pipe import LayerSpec, PipelineModule, TiedLayerSpec

STEPS, MBS, CLIP, LR, BASE_SEED = 4, 2, 0.05, 0.05, 1234


class Block(nn.Module):
    """h + proj(tanh(fc(h))), built whole from a seed, then sharded when a tensor group is given."""

    def __init__(self, group=None):
        super().__init__()
        fc, proj = nn.Linear(8, 16), nn.Linear(16, 8)
        if group is not None:
            fc, proj = ColumnParallelLinear.from_linear(fc, group), RowParallelLinear.from_linear(proj, group)
        self.fc, self.proj = fc, proj

    def forward(self, h):
        return h + self.proj(torch.tanh(self.fc(h)))


def specs(model: str, group=None):
    if model == "tp":
        return [LayerSpec(Block, group), LayerSpec(Block, group), LayerSpec(Block, group), LayerSpec(nn.Linear, 8, 8)]
    if model == "tied":
        return [TiedLayerSpec("io", nn.Linear, 8, 8, bias=False), LayerSpec(nn.Tanh),
                LayerSpec(nn.Linear, 8, 8), LayerSpec(nn.Tanh), TiedLayerSpec("io", nn.Linear, 8, 8, bias=False)]
    return [LayerSpec(nn.Linear, 8, 16), LayerSpec(nn.Tanh), LayerSpec(nn.Linear, 16, 16), LayerSpec(nn.Tanh),
            LayerSpec(nn.Linear, 16, 8)]


def reference_layers(model: str) -> list:
    """Every layer built in one process with the seeds seed_layers uses; ties reuse the first build."""
    layers, tied = [], {}
    for index, spec in enumerate(specs(model)):
        torch.manual_seed(BASE_SEED + index)
        if isinstance(spec, TiedLayerSpec):
            tied.setdefault(spec.key, spec.build())
            layers.append(tied[spec.key])
        else:
            layers.append(spec.build())
    return layers


def data(dp: int, gas: int):
    generator = torch.Generator().manual_seed(0)
    count = STEPS * gas * dp * MBS
    return torch.randn(count, 8, generator=generator), torch.randn(count, 8, generator=generator)


def micro_batches(x, y, dp: int, gas: int, data_rank: int, first_step: int = 0):
    for step in range(first_step, STEPS):
        for micro in range(gas):
            start = ((step * gas + micro) * dp + data_rank) * MBS
            yield x[start:start + MBS], y[start:start + MBS]


def reference(model: str, dp: int, gas: int, steps: int = STEPS):
    layers = reference_layers(model)
    net = nn.Sequential(*layers)
    unique = list({id(p): p for p in net.parameters()}.values())
    optimizer = torch.optim.AdamW(unique, lr=LR, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)
    x, y = data(dp, gas)
    losses = []
    for step in range(steps):
        per_step = []
        for micro in range(gas):
            for data_rank in range(dp):
                start = ((step * gas + micro) * dp + data_rank) * MBS
                loss = nn.functional.mse_loss(net(x[start:start + MBS]), y[start:start + MBS])
                (loss / (gas * dp)).backward()
                per_step.append(loss.item())
        norm = torch.nn.utils.clip_grad_norm_(unique, CLIP)
        optimizer.step()
        optimizer.zero_grad()
        losses.append((sum(per_step) / len(per_step), float(norm)))
    return layers, losses


def main():
    num_stages, schedule, model, gas, method = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    tensor = int(sys.argv[6]) if len(sys.argv) > 6 else 1
    # "plain+ckpt": activation checkpoint every 2 layers; "+zero1": ZeRO stage 1 over the data axis
    model, *modifiers = model.split("+")
    checkpointed, zero_stage = "ckpt" in modifiers, 1 if "zero1" in modifiers else 0
    schedule, _, virtual = schedule.partition(":")  # "interleaved:2": two chunks per rank
    zero.init_distributed()
    world_size = int(os.environ["WORLD_SIZE"])
    grid = ParallelGrid(PipeModelDataParallelTopology(num_stages, tensor, world_size // (num_stages * tensor)))
    module = PipelineModule(specs(model, grid.get_model_parallel_group() if tensor > 1 else None), topology=grid,
                            loss_fn=nn.functional.mse_loss, partition_method=method, seed_layers=True,
                            base_seed=BASE_SEED, activation_checkpoint_interval=2 if checkpointed else 0,
                            num_virtual_stages=int(virtual or 1))
    config = {"train_micro_batch_size_per_gpu": MBS, "gradient_accumulation_steps": gas, "gradient_clipping": CLIP,
              "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": [0.9, 0.99], "eps": 1e-8,
                                                        "weight_decay": 0.01}},
              "pipeline": {"schedule": schedule}, "zero_optimization": {"stage": zero_stage}}
    engine, _, _, _ = zero.initialize(model=module, config=config)
    calls = [0]
    for child in module.children():
        child.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    dp = engine.grid.get_data_parallel_world_size()
    mode, folder = (sys.argv[7], sys.argv[8]) if len(sys.argv) > 8 else ("train", None)
    first, last, extra = (0, STEPS // 2, {}) if mode == "save" else (0, STEPS, {})
    if mode == "resume":
        engine.load_checkpoint(folder)
        first = engine.global_steps
        extra["consolidated_error"] = _consolidated_error(folder, reference(model, dp, gas, steps=first)[0], module)
    x, y = data(dp, gas)
    batches = micro_batches(x, y, dp, gas, engine.grid.get_data_parallel_rank(), first_step=first)
    losses = [(float(engine.train_batch(batches)), engine.get_global_grad_norm()) for _ in range(first, last)]
    if mode == "save":
        engine.save_checkpoint(folder)
    layers, ref_losses = reference(model, dp, gas, steps=last)
    ref_losses = ref_losses[first:]
    error = 0.0
    for key, value in engine.module.named_parameters():
        index, _, name = key.partition(".")
        owner = layers[int(index)] if index.isdigit() else _tied(layers, module, name.split(".")[0])
        expected = owner.get_parameter(name if index.isdigit() else name.split(".", 1)[1]).detach()
        if getattr(value, "tensor_model_parallel", False):
            expected = expected.chunk(tensor, dim=value.partition_dim)[grid.get_model_parallel_rank()]
        error = max(error, (value.detach() - expected).abs().max().item())
    print("RESULT " + json.dumps({
        "rank": int(os.environ["RANK"]), "stage": engine.grid.get_stage_id(), "dp": dp,
        "data_rank": engine.grid.get_data_parallel_rank(), "parts": module.parts, "keys": sorted(engine.state_dict()),
        "max_abs_error": error, "losses": losses, "global_steps": engine.global_steps, **extra, "reference_losses": ref_losses,
        "param_bytes": sum(p.numel() * p.element_size() for p in engine.parameters()), "tensor": tensor, "layer_forwards": calls[0],
        "model_rank": grid.get_model_parallel_rank(), "accessors": accessors(engine),
        "optimizer_state_numel": sum(v.numel() for state in engine.optimizer.state.values() for v in state.values()
                                     if torch.is_tensor(v) and v.dim() > 0),
        "reference_param_counts": [sum(p.numel() for p in layer.parameters()) for layer in layers]}), flush=True)


def accessors(engine) -> dict:
    """What a DeepSpeed pipeline script reads off the engine besides train_batch."""
    return {"world_size": engine.world_size, "dp_world_size": engine.dp_world_size,
            "mp_world_size": engine.mp_world_size, "global_rank": engine.global_rank,
            "local_rank": engine.local_rank, "device": str(engine.device),
            "train_batch_size": engine.train_batch_size(),
            "train_micro_batch_size_per_gpu": engine.train_micro_batch_size_per_gpu(),
            "gradient_accumulation_steps": engine.gradient_accumulation_steps(),
            "global_samples": engine.global_samples, "was_step_applied": engine.was_step_applied()}


def _consolidated_error(folder, layers, module) -> float:
    """dslaunch-zero-to-fp32's full state dict against the reference model at the same step."""
    state = zero.get_fp32_state_dict_from_zero_checkpoint(folder)
    error = 0.0
    for key, value in state.items():
        index, _, name = key.partition(".")
        owner = layers[int(index)] if index.isdigit() else _tied(layers, module, name.split(".")[0])
        expected = owner.get_parameter(name if index.isdigit() else name.split(".", 1)[1]).detach()
        error = max(error, (value - expected).abs().max().item())
    return error


def _tied(layers, module, key: str):
    index = next(i for i, spec in enumerate(module._layer_specs) if isinstance(spec, TiedLayerSpec) and spec.key == key)
    return layers[index]


if __name__ == "__main__":
    main()
