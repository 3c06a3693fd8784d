"""The MoE layer at ep 1 against a plain, token-by-token computation of the same gating.

The reference below is written from the gating rules (Switch top-1 with random token selection,
GShard top-2, top-k) with loops over tokens and experts, and torch.distributions for the draws
(taken in the documented order), so it shares no code with ``launcher.zero.experts``.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from launcher.zero.errors import ConfigError
from launcher.zero.experts import MoE
from launcher.zero.experts.gating import capacity_for, gumbel

HIDDEN, TOKENS, SEED = 6, 20, 5


def _uniform(shape, low, high):
    return torch.distributions.Uniform(torch.tensor(low), torch.tensor(high)).rsample(shape)


def _gumbel(shape):
    return torch.distributions.Gumbel(torch.tensor(0.0), torch.tensor(1.0)).rsample(shape)


def plain_moe(layer: MoE, x: torch.Tensor, training=True):
    """(output, l_aux, exp_counts) of ``layer`` on ``x`` [S, M], one token at a time."""
    gate = layer.deepspeed_moe.gate
    policy, experts = gate.policy, layer.deepspeed_moe.experts.deepspeed_experts
    k, num_experts, num_tokens = policy.k, len(experts), x.shape[0]
    inputs = x.float()
    if training and policy.noisy_gate_policy == "Jitter":
        inputs = inputs * _uniform(inputs.shape, 1.0 - 1e-2, 1.0 + 1e-2)
    logits = inputs @ gate.wg.weight.float().t()
    probs = F.softmax(logits, dim=1)
    factor = policy.capacity_factor if training else policy.eval_capacity_factor
    capacity = max(math.ceil(round(num_tokens / num_experts * factor * k, 5)), policy.min_capacity)
    routes = []                                   # (token, expert, order) in slot-priority order
    if k == 1:
        scores = logits + _gumbel(logits.shape) if training and policy.noisy_gate_policy == "RSample" else probs
        choice = [int(torch.argmax(scores[t])) for t in range(num_tokens)]
        counts = [choice.count(e) for e in range(num_experts)]
        me = probs.mean(0)
        l_aux = sum(float(me[e]) * counts[e] / num_tokens for e in range(num_experts)) * num_experts
        if not policy.drop_tokens:
            capacity = max(counts)
        draw = torch.rand(num_tokens, num_experts) if policy.use_rts else None
        kept = set()
        for e in range(num_experts):
            mine = [t for t in range(num_tokens) if choice[t] == e]
            if draw is not None:
                mine = sorted(mine, key=lambda t: -float(draw[t, e]))
            kept |= set(mine[:capacity])
        routes = [(t, choice[t], 0) for t in range(num_tokens) if t in kept]
        weight = {(t, choice[t]): float(probs[t, choice[t]]) for t in range(num_tokens)}
    else:
        if k == 2:
            first = [int(torch.argmax(probs[t])) for t in range(num_tokens)]
            noisy = logits + _gumbel(logits.shape) if policy.top2_2nd_expert_sampling else logits
            second = [max((e for e in range(num_experts) if e != first[t]), key=lambda e: float(noisy[t, e]))
                      for t in range(num_tokens)]
            chosen = [[first[t], second[t]] for t in range(num_tokens)]
            ranked = [(t, first[t], 0) for t in range(num_tokens)] + [(t, second[t], 1) for t in range(num_tokens)]
            me = probs.mean(0)
            l_aux = sum(float(me[e]) * first.count(e) / num_tokens for e in range(num_experts)) * num_experts
        else:
            chosen = [sorted(range(num_experts), key=lambda e: -float(probs[t, e]))[:k] for t in range(num_tokens)]
            # a full expert keeps its most confident routes
            ranked = sorted(((t, e, 0) for t in range(num_tokens) for e in chosen[t]), key=lambda r: -float(probs[r[0], r[1]]))
            me = probs.mean(0)
            share = [sum(e in chosen[t] for t in range(num_tokens)) / num_tokens for e in range(num_experts)]
            l_aux = sum(float(me[e]) * share[e] for e in range(num_experts)) * num_experts / k
        counts = [sum(e in chosen[t] for t in range(num_tokens)) for e in range(num_experts)]
        if not policy.drop_tokens:
            capacity = max(counts)
        load = [0] * num_experts
        for t, e, order in ranked:
            if load[e] < capacity:
                load[e] += 1
                routes.append((t, e, order))
        weight = {}
        for t in range(num_tokens):
            mine = [e for (tt, e, _) in routes if tt == t]
            total = max(sum(float(probs[t, e]) for e in mine), torch.finfo(torch.float32).eps)
            weight.update({(t, e): float(probs[t, e]) / total for e in mine})
    output = torch.zeros_like(x)
    for t, e, _ in routes:
        output[t] += weight[(t, e)] * experts[e](x[t:t + 1])[0]
    if layer.use_residual:
        mix = F.softmax(layer.coefficient(x), dim=-1)
        output = output * mix[:, 0:1] + layer.mlp(x) * mix[:, 1:]
    return output, l_aux, counts


CASES = {
    "top1 random token selection, drops": dict(num_experts=4, k=1, capacity_factor=0.5),
    "top1 RSample": dict(num_experts=4, k=1, noisy_gate_policy="RSample", capacity_factor=0.75),
    "top1 Jitter": dict(num_experts=4, k=1, noisy_gate_policy="Jitter"),
    "top1 no drop": dict(num_experts=4, k=1, drop_tokens=False),
    "top2 sampled second, drops": dict(num_experts=4, k=2, capacity_factor=0.5),
    "top2 no sampling": dict(num_experts=5, k=2, top2_2nd_expert_sampling=False, min_capacity=0),
    "top2 no drop": dict(num_experts=4, k=2, drop_tokens=False),
    "top3 drops": dict(num_experts=6, k=3, capacity_factor=0.5, min_capacity=0),
    "top3 no drop": dict(num_experts=6, k=3, drop_tokens=False),
    "residual top1": dict(num_experts=4, k=1, use_residual=True),
}


def _layer(**kwargs):
    torch.manual_seed(SEED)
    expert = torch.nn.Sequential(torch.nn.Linear(HIDDEN, 2 * HIDDEN), torch.nn.Tanh(), torch.nn.Linear(2 * HIDDEN, HIDDEN))
    layer = MoE(HIDDEN, expert, **kwargs)
    for index, local in enumerate(layer.deepspeed_moe.experts.deepspeed_experts):
        with torch.no_grad():                 # distinct experts, so a wrong route shows
            for param in local.parameters():
                param.add_(0.1 * index)
    return layer


@pytest.mark.parametrize("name", list(CASES))
def test_layer_matches_plain_token_by_token_gating(name):
    layer = _layer(**CASES[name])
    x = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(11)
    output, l_aux, exp_counts = layer(x.view(4, 5, HIDDEN))
    torch.manual_seed(11)
    with torch.no_grad():
        expected, expected_aux, expected_counts = plain_moe(layer, x)
    assert output.shape == (4, 5, HIDDEN)
    assert exp_counts.tolist() == expected_counts
    assert abs(l_aux.item() - expected_aux) < 1e-6
    print(f"{name}: max abs output error {(output.view(TOKENS, HIDDEN) - expected).abs().max().item():.1e}, "
          f"l_aux error {abs(l_aux.item() - expected_aux):.1e}")
    torch.testing.assert_close(output.view(TOKENS, HIDDEN), expected, atol=1e-6, rtol=1e-5)


def test_dropping_is_real_and_no_drop_keeps_every_token():
    x = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    dropped = _layer(num_experts=4, k=1, capacity_factor=0.25, min_capacity=0)(x)[0]
    kept = _layer(num_experts=4, k=1, drop_tokens=False)(x)[0]
    assert (dropped.abs().sum(1) == 0).sum() >= TOKENS // 2       # capacity 2 x 4 experts: most are dropped
    assert (kept.abs().sum(1) > 0).all()


def test_eval_uses_eval_capacity_factor_and_no_noise():
    layer = _layer(num_experts=4, k=1, noisy_gate_policy="RSample", capacity_factor=0.25, eval_capacity_factor=4.0,
                   min_capacity=0, use_rts=False)
    x = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(1))
    layer.eval()
    first, second = layer(x)[0], layer(x)[0]
    torch.testing.assert_close(first, second, rtol=0, atol=0)      # no noise in eval
    assert (first.abs().sum(1) > 0).all()                           # capacity 20 per expert: nothing dropped


def test_used_token_masks_tokens_out_of_top1():
    layer = _layer(num_experts=4, k=1, drop_tokens=False)
    x = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(1))
    used = torch.ones(TOKENS)
    used[::2] = 0
    output, _, exp_counts = layer(x, used)
    assert float(exp_counts.sum()) == TOKENS // 2
    assert (output[::2] == 0).all() and (output[1::2].abs().sum(1) > 0).all()


def test_capacity_rounds_like_deepspeed():
    assert capacity_for(24, 4, 1.0, 4) == 6
    assert capacity_for(24, 4, 0.5, 4) == 4          # min_capacity wins
    assert capacity_for(10, 4, 1.0, 0) == 3          # ceil(2.5)
    assert capacity_for(24, 6, 1.5, 0) == 6


def test_gumbel_draws_are_torch_distributions_gumbel():
    torch.manual_seed(3)
    ours = gumbel((50, 7), "cpu")
    torch.manual_seed(3)
    assert torch.equal(ours, _gumbel((50, 7)))


def test_experts_are_marked_and_named_as_deepspeed_does():
    layer = _layer(num_experts=4, k=2, use_residual=True)
    names = [n for n, _ in layer.named_parameters()]
    assert names[0] == "deepspeed_moe.gate.wg.weight"
    assert "deepspeed_moe.experts.deepspeed_experts.3.2.bias" in names and "coefficient.weight" in names
    expert_params = dict(layer.deepspeed_moe.experts.named_parameters())
    assert all(p.allreduce is False and p.group_name == "ep_size_1" for p in expert_params.values())
    assert not hasattr(layer.deepspeed_moe.gate.wg.weight, "allreduce")
    assert not hasattr(layer.mlp[0].weight, "allreduce")           # the residual MLP is dense


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_experts=6, ep_size=4), "ep_size 4 does not divide num_experts 6"),
    (dict(num_experts=4, k=5), "k 5 must be an integer from 1 to num_experts (4)"),
    (dict(num_experts=4, noisy_gate_policy="Gumbel"), "noisy_gate_policy 'Gumbel' is not one of"),
    (dict(num_experts=4, capacity_factor=0), "capacity_factor 0 must be > 0"),
])
def test_bad_layer_arguments_are_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        MoE(HIDDEN, torch.nn.Linear(HIDDEN, HIDDEN), **kwargs)


def test_too_few_tokens_for_min_capacity_and_a_missing_group_say_what_to_do():
    with pytest.raises(ConfigError, match="3 tokens is fewer than min_capacity 4") as raised:
        _layer(num_experts=2, k=1)(torch.randn(3, HIDDEN))
    assert "min_capacity=0" in raised.value.hint
    with pytest.raises(ConfigError, match="ep_size 2 has no expert group"):
        _layer(num_experts=2, ep_size=2, k=1)(torch.randn(8, HIDDEN))
