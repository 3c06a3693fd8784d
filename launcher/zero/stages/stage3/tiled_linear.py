"""``deepspeed.zero.TiledLinear``: a linear layer cut into tiles along its input and output features.

With ZeRO-3 each tile is a parameter of its own, gathered only while it runs, so a layer too large
to gather whole fits. The tiles compute exactly the layer's product: the input is split along its
last dimension, each output tile is the sum of its row of tiles, the output tiles are joined.
"""
from __future__ import annotations

import torch

from launcher.zero.layout.partition_math import partition_uniform
from launcher.zero.stages.stage3.init_context import GatheredParameters


class TiledLinear(torch.nn.Module):
    """``torch.nn.Linear(in_features, out_features, bias)`` as ``out_splits`` x ``in_splits`` tiles
    (DeepSpeed's arguments and behaviour): ``linears[out][in]`` is a ``linear_cls``; only the last
    input tile of a row has a bias. ``init_linear`` copies an existing layer's weights in."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, in_splits: int = 1,
                 out_splits: int = 1, input_is_already_split: bool = False, combine_out_splits: bool = True,
                 linear_cls=torch.nn.Linear, init_linear=None, **kwargs):
        super().__init__()
        if in_splits < 1 or in_splits > in_features:
            raise RuntimeError("in splits must be in range [1, in_features].")
        if out_splits < 1 or out_splits > out_features:
            raise RuntimeError("out splits must be in range [1, out_features].")
        self.in_features, self.out_features, self.use_bias = in_features, out_features, bias
        self.in_splits, self.out_splits = in_splits, out_splits
        self.input_is_already_split, self.combine_out_splits = input_is_already_split, combine_out_splits
        # CSR-style bounds: tile p covers [parts[p], parts[p + 1])
        self.in_parts = partition_uniform(in_features, in_splits)
        self.out_parts = partition_uniform(out_features, out_splits)
        self.linears = torch.nn.ModuleList()
        for out_id in range(out_splits):
            row = torch.nn.ModuleList()
            for in_id in range(in_splits):
                row.append(linear_cls(self.in_parts[in_id + 1] - self.in_parts[in_id],
                                      self.out_parts[out_id + 1] - self.out_parts[out_id],
                                      bias=bias if in_id == in_splits - 1 else False, **kwargs))
            self.linears.append(row)
        if init_linear is not None:
            self.copy_params_from(init_linear)

    def forward(self, input_):
        if self.in_splits > 1 and not self.input_is_already_split:
            parts = partition_uniform(input_.shape[-1], self.in_splits)
            inputs = self._split_global_input(input_, [parts[p + 1] - parts[p] for p in range(self.in_splits)])
        elif self.in_splits > 1:
            inputs = input_
            if len(inputs) != self.in_splits:
                raise ValueError(f"Col splits {self.in_splits} does not match input splits {len(inputs)}")
        else:
            inputs = [input_]
        outputs = [None] * self.out_splits
        for out_id in range(self.out_splits):
            for in_id in range(self.in_splits):
                local = self.linears[out_id][in_id](inputs[in_id])
                outputs[out_id] = self._reduce_local_output(in_id=in_id, out_id=out_id, current_out=outputs[out_id],
                                                            new_out=local)
        return self._combine_output_splits(outputs) if self.combine_out_splits else outputs

    def _split_global_input(self, input, split_sizes):
        """The input cut along its last dimension into the input tiles' widths."""
        return torch.split(input, split_sizes, dim=input.dim() - 1)

    def _reduce_local_output(self, in_id, out_id, current_out, new_out):
        """Add one tile's product to its output tile's sum (the first is copied: a view of it must
        not be updated in place)."""
        return new_out.clone() if current_out is None else current_out + new_out

    def _combine_output_splits(self, outputs):
        return torch.cat(outputs, dim=-1)

    @torch.no_grad()
    def copy_params_from(self, other) -> None:
        """Copy ``other``'s weight (and bias) into the tiles; at ZeRO-3 rank 0's copy wins (collective)."""
        if tuple(other.weight.size()) != (self.out_features, self.in_features):
            raise ValueError(f"copy_params_from: weight of shape {tuple(other.weight.size())}, expected "
                             f"{(self.out_features, self.in_features)}")
        if self.use_bias != (getattr(other, "bias", None) is not None):
            raise ValueError("copy_params_from: the layers differ in having a bias")
        for row in range(self.out_splits):
            rows = slice(self.out_parts[row], self.out_parts[row + 1])
            for col in range(self.in_splits):
                local = self.linears[row][col]
                with GatheredParameters(local.weight, modifier_rank=0):
                    local.weight.copy_(other.weight[rows, self.in_parts[col]:self.in_parts[col + 1]])
            if local.bias is not None:
                with GatheredParameters(local.bias, modifier_rank=0):
                    local.bias.copy_(other.bias[rows])


class TiledLinearReturnBias(TiledLinear):
    """For tiles that return ``(output, bias)`` (Megatron's layers): the outputs are summed, the
    biases are passed through and joined."""

    def _reduce_local_output(self, in_id, out_id, current_out, new_out):
        old_tensor, old_bias = current_out if current_out is not None else (None, None)
        tensor, bias = new_out
        tensor = super()._reduce_local_output(in_id=in_id, out_id=out_id, current_out=old_tensor, new_out=tensor)
        return tensor, old_bias if bias is None else bias

    def _combine_output_splits(self, outputs):
        tensor = super()._combine_output_splits([out[0] for out in outputs])
        biases = [out[1] for out in outputs if out[1] is not None]
        return tensor, (super()._combine_output_splits(biases) if biases else None)
