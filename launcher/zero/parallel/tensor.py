"""Megatron-style tensor parallelism: column/row-parallel linears, a vocabulary-parallel embedding
and the matching fused cross-entropy, each holding only its shard of the full weight.

Sharded parameters carry ``tensor_model_parallel = True`` and ``partition_dim`` (Megatron's
attribute names), which is how the engine counts each shard once in the global gradient norm.
Build them from a full module (``ColumnParallelLinear.from_linear(linear, group)``) or in place
with a plan (``apply_tensor_parallel``). With ``sequence_parallel=True`` the linears take and give
activations split along the sequence (see ``sequence.py``): a column-parallel linear all-gathers its
input, a row-parallel one reduce-scatters its output.
"""
from __future__ import annotations

import fnmatch

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from launcher.zero.errors import ConfigError
from launcher.zero.parallel.regions import copy_to, gather_from, reduce_from, scatter_to
from launcher.zero.parallel.sequence import (SequenceParallelLayerNorm, SequenceParallelRMSNorm,
                                             gather_sequence_for_column, mark_sequence_parallel,
                                             reduce_scatter_sequence, replicated_on_sequence)


def _mark(param: nn.Parameter, dim: int) -> nn.Parameter:
    param.tensor_model_parallel = True
    param.partition_dim = dim
    return param


def _shard(full: torch.Tensor, dim: int, group, what: str) -> torch.Tensor:
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    if full.shape[dim] % size:
        raise ConfigError(f"tensor parallelism: {what} has {full.shape[dim]} along dim {dim}, which {size} "
                          "tensor-parallel ranks do not divide", hint="choose a tensor size dividing the layer width")
    return full.detach().chunk(size, dim=dim)[rank].clone()


class ColumnParallelLinear(nn.Module):
    """``y = x W^T + b`` with W split by output rows: each rank computes its slice of y.

    With ``sequence_parallel`` the input is this rank's slice of the sequence (dim ``sequence_dim``)
    and is all-gathered first; the output is the whole sequence, split by features as usual.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group, gather_output: bool = False,
                 sequence_parallel: bool = False, sequence_dim: int = 1):
        super().__init__()
        self.group, self.gather_output = group, gather_output
        self.sequence_parallel, self.sequence_dim = sequence_parallel, sequence_dim
        self.weight = _mark(nn.Parameter(_shard(weight, 0, group, "the weight's output features")), 0)
        self.bias = _mark(nn.Parameter(_shard(bias, 0, group, "the bias")), 0) if bias is not None else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, group, gather_output: bool = False, sequence_parallel: bool = False,
                    sequence_dim: int = 1) -> "ColumnParallelLinear":
        return cls(linear.weight, linear.bias, group, gather_output, sequence_parallel, sequence_dim)

    def forward(self, x):
        if self.sequence_parallel:
            x = gather_sequence_for_column(x, self.group, self.sequence_dim)
        else:
            x = copy_to(x, self.group)
        y = F.linear(x, self.weight, self.bias)
        return gather_from(y, self.group) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """``y = x W^T + b`` with W split by input columns; partial products are all-reduced, b added once.

    With ``sequence_parallel`` the partial products are reduce-scattered along the sequence instead,
    so each rank gets its slice; the bias is then added per slice and its gradient summed over the group.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group, input_is_parallel: bool = True,
                 sequence_parallel: bool = False, sequence_dim: int = 1):
        super().__init__()
        if sequence_parallel and not input_is_parallel:
            raise ConfigError("tensor parallelism: a sequence-parallel row-parallel linear needs its input split "
                              "by features", hint="feed it a column-parallel linear's output (input_is_parallel=True)")
        self.group, self.input_is_parallel = group, input_is_parallel
        self.sequence_parallel, self.sequence_dim = sequence_parallel, sequence_dim
        self.weight = _mark(nn.Parameter(_shard(weight, 1, group, "the weight's input features")), 1)
        self.bias = nn.Parameter(bias.detach().clone()) if bias is not None else None   # replicated
        if sequence_parallel:
            mark_sequence_parallel(self.bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group, input_is_parallel: bool = True, sequence_parallel: bool = False,
                    sequence_dim: int = 1) -> "RowParallelLinear":
        return cls(linear.weight, linear.bias, group, input_is_parallel, sequence_parallel, sequence_dim)

    def forward(self, x):
        if not self.input_is_parallel:
            x = scatter_to(x, self.group)
        partial = F.linear(x, self.weight)
        if self.sequence_parallel:
            y = reduce_scatter_sequence(partial, self.group, self.sequence_dim)
            return y + replicated_on_sequence(self.bias, self.group) if self.bias is not None else y
        y = reduce_from(partial, self.group)
        return y + self.bias if self.bias is not None else y


class VocabParallelEmbedding(nn.Module):
    """An embedding whose rows (the vocabulary) are split; each rank looks up the ids it holds."""

    def __init__(self, weight: torch.Tensor, group):
        super().__init__()
        self.group = group
        self.weight = _mark(nn.Parameter(_shard(weight, 0, group, "the vocabulary")), 0)
        self.vocab_start = dist.get_rank(group) * self.weight.shape[0]

    @classmethod
    def from_embedding(cls, embedding: nn.Embedding, group) -> "VocabParallelEmbedding":
        return cls(embedding.weight, group)

    def forward(self, ids):
        local = ids - self.vocab_start
        outside = (local < 0) | (local >= self.weight.shape[0])
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from(out, self.group)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy over logits split along the vocabulary, without gathering them."""

    @staticmethod
    def forward(ctx, logits, target, group):
        logits = logits.float()
        vocab_local = logits.shape[-1]
        start = dist.get_rank(group) * vocab_local
        top = logits.max(dim=-1, keepdim=True).values
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        shifted = logits - top
        local = target - start
        outside = (local < 0) | (local >= vocab_local)
        local = local.masked_fill(outside, 0)
        picked = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        dist.all_reduce(picked, group=group)
        exp = shifted.exp()
        total = exp.sum(dim=-1)
        dist.all_reduce(total, group=group)
        ctx.save_for_backward(exp / total.unsqueeze(-1), local, outside)
        return total.log() - picked

    @staticmethod
    def backward(ctx, grad):
        softmax, local, outside = ctx.saved_tensors
        grad_logits = softmax.clone()
        hit = (~outside).to(softmax.dtype)
        grad_logits.scatter_add_(-1, local.unsqueeze(-1), -hit.unsqueeze(-1))
        return grad_logits * grad.unsqueeze(-1), None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, group) -> torch.Tensor:
    """Per-token loss (shape of ``target``) from vocabulary-split ``logits``; ``.mean()`` it as usual."""
    if dist.get_world_size(group) == 1:
        return F.cross_entropy(logits.float().flatten(0, -2), target.flatten(), reduction="none").view_as(target)
    return _VocabParallelCrossEntropy.apply(logits, target, group)


def _norm(module: nn.Module, group, sequence_parallel: bool, name: str) -> nn.Module:
    """A norm stays as it is without sequence parallelism; with it, it runs on the slice (grads summed)."""
    if isinstance(module, nn.LayerNorm):
        return SequenceParallelLayerNorm.from_norm(module, group) if sequence_parallel else module
    if isinstance(module, nn.RMSNorm):
        return SequenceParallelRMSNorm.from_norm(module, group) if sequence_parallel else module
    raise ConfigError(f"tensor-parallel plan: '{name}' is a {type(module).__name__}, style 'norm' takes "
                      "nn.LayerNorm or nn.RMSNorm", hint="name only the layer norms with 'norm'")


#: plan styles -> how a full module becomes its tensor-parallel shard: (module, group, sequence_parallel,
#: sequence_dim, name) -> module
_STYLES = {
    "colwise": lambda m, g, sp, d, n: ColumnParallelLinear.from_linear(m, g, sequence_parallel=sp, sequence_dim=d),
    "colwise_gather": lambda m, g, sp, d, n: ColumnParallelLinear.from_linear(m, g, gather_output=True,
                                                                              sequence_parallel=sp, sequence_dim=d),
    "rowwise": lambda m, g, sp, d, n: RowParallelLinear.from_linear(m, g, sequence_parallel=sp, sequence_dim=d),
    "vocab": lambda m, g, sp, d, n: VocabParallelEmbedding.from_embedding(m, g),
    "norm": lambda m, g, sp, d, n: _norm(m, g, sp, n),
}


def apply_tensor_parallel(model: nn.Module, plan: dict[str, str], group, sequence_parallel: bool = False,
                          sequence_dim: int = 1) -> nn.Module:
    """Replace the submodules named by ``plan`` (fnmatch patterns -> style) with their shards, in place.

    Styles: ``colwise`` (nn.Linear, output split), ``colwise_gather`` (the same, output gathered),
    ``rowwise`` (nn.Linear, input split, output all-reduced), ``vocab`` (nn.Embedding), ``norm``
    (nn.LayerNorm / nn.RMSNorm: unchanged, or on the sequence slice under sequence parallelism). A GPT
    block: ``{"blocks.*.q": "colwise", ..., "blocks.*.proj": "rowwise", "blocks.*.norm*": "norm"}``.
    ``sequence_parallel=True`` splits the activations between the linears along ``sequence_dim`` (1 for
    ``[batch, seq, hidden]``): the model then calls ``scatter_sequence`` where that part starts and
    every norm and row-parallel bias in it must be in the plan. A pattern that matches nothing is an error.
    """
    names = [name for name, _ in model.named_modules() if name]
    for pattern, style in plan.items():
        if style not in _STYLES:
            raise ConfigError(f"tensor-parallel plan: '{pattern}': style '{style}' is not one of {sorted(_STYLES)}",
                              hint='"colwise" or "rowwise" for nn.Linear, "vocab" for nn.Embedding, '
                                   '"norm" for nn.LayerNorm')
        matched = [name for name in names if fnmatch.fnmatchcase(name, pattern)]
        if not matched:
            raise ConfigError(f"tensor-parallel plan: '{pattern}' matches no submodule",
                              hint=f"module names look like {names[:4]}")
        for name in matched:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, _STYLES[style](getattr(parent, child), group, sequence_parallel, sequence_dim, name))
    return model
