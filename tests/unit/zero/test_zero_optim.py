"""Optimizers by name and Lamb's trust ratio (FusedLamb's formula, deepspeed/ops/lamb)."""
import math

import pytest
import torch

from launcher.zero.config.schema import NamedConfig
from launcher.zero.errors import ConfigError
from launcher.zero.optim import Lamb, build_optimizer, lamb_coefficient


@pytest.mark.parametrize("weight,update,expected", [(0.0, 1.0, 1.0), (1.0, 0.0, 1.0), (1.0, 2.0, 0.5),
                                                    (100.0, 1.0, 10.0), (1e-5, 1.0, 0.01)])
def test_trust_ratio(weight, update, expected):
    assert lamb_coefficient(weight, update) == expected


def test_lamb_step_matches_formula():
    p = torch.nn.Parameter(torch.tensor([3.0, 4.0]))
    p.grad = torch.tensor([0.5, -1.0])
    opt = Lamb([p], lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    opt.step()
    m, v = 0.1 * torch.tensor([0.5, -1.0]), 0.001 * torch.tensor([0.25, 1.0])
    u = m / (v.sqrt() + 1e-8) + 0.01 * torch.tensor([3.0, 4.0])
    coeff = min(max(5.0 / u.norm().item(), 0.01), 10.0)
    step = 0.1 * math.sqrt(1 - 0.999) / (1 - 0.9)
    assert torch.allclose(p.detach(), torch.tensor([3.0, 4.0]) - step * coeff * u, atol=1e-6)
    assert opt.get_lamb_coeffs() == [pytest.approx(coeff)]


def params():
    return [torch.nn.Parameter(torch.zeros(3))]


def test_adam_means_adamw_unless_adam_w_mode_false():
    assert type(build_optimizer(NamedConfig("Adam", {"lr": 1e-3}), params())) is torch.optim.AdamW
    assert type(build_optimizer(NamedConfig("adam", {"adam_w_mode": False}), params())) is torch.optim.Adam
    assert type(build_optimizer(NamedConfig("AdamW", {"torch_adam": True}), params())) is torch.optim.AdamW
    assert type(build_optimizer(NamedConfig("RMSprop", {"lr": 0.1}), params())) is torch.optim.RMSprop


@pytest.mark.parametrize("spec,match", [(NamedConfig("Adamm", {}), "unknown optimizer 'Adamm'"),
                                        (NamedConfig("SGD", {"lrr": 1}), "optimizer.params: SGD"),
                                        (NamedConfig("Lion", {}), "not available")])
def test_optimizer_errors(spec, match):
    with pytest.raises(ConfigError, match=match):
        build_optimizer(spec, params())


def test_adam_reads_generator_params_once_and_stays_unfused_on_cpu():
    import torch

    from launcher.zero.config.schema import NamedConfig
    from launcher.zero.optim import build_optimizer
    model = torch.nn.Linear(4, 2)
    opt = build_optimizer(NamedConfig("Adam", {"lr": 1e-3}), model.parameters())
    assert sum(len(g["params"]) for g in opt.param_groups) == 2
    assert not opt.defaults.get("fused")
    groups = [{"params": (p for p in model.parameters()), "weight_decay": 0.0}]
    opt = build_optimizer(NamedConfig("AdamW", {"lr": 1e-3}), groups)
    assert len(opt.param_groups[0]["params"]) == 2


# DeepSpeed 0.19.8's constructor defaults (../shared/reference/deepspeed-engine.md §1.6, §4.3):
# FusedAdam and DeepSpeedCPUAdam, FusedLamb, OnebitAdam. Written out here, not read from the code.
FUSED_ADAM = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}
LAMB = {"lr": 1e-3, "bias_correction": True, "betas": (0.9, 0.999), "eps": 1e-8, "eps_inside_sqrt": False,
        "weight_decay": 0.0, "max_coeff": 10.0, "min_coeff": 0.01}
ONEBIT = {"lr": 1e-3, "bias_correction": True, "betas": (0.9, 0.999), "eps": 1e-8, "eps_inside_sqrt": False,
          "weight_decay": 0.0, "max_grad_norm": 0.0}


@pytest.mark.parametrize("name,params,offload,cls,expected", [
    ("Adam", {}, False, "AdamW", FUSED_ADAM),
    ("AdamW", {}, False, "AdamW", FUSED_ADAM),
    ("adam", {"adam_w_mode": False}, False, "Adam", FUSED_ADAM),
    ("Adam", {}, True, "CPUAdam", {**FUSED_ADAM, "adamw_mode": True, "bias_correction": True}),
    ("AdamW", {}, True, "CPUAdam", {**FUSED_ADAM, "adamw_mode": True, "bias_correction": True}),
    ("Adam", {"adam_w_mode": False}, True, "CPUAdam", {**FUSED_ADAM, "adamw_mode": False}),
    # "torch_adam": true is torch's class with torch's own defaults, as in DeepSpeed
    ("AdamW", {"torch_adam": True}, False, "AdamW", {"lr": 1e-3, "weight_decay": 1e-2, "eps": 1e-8}),
    ("Adam", {"torch_adam": True, "adam_w_mode": False}, False, "Adam", {"lr": 1e-3, "weight_decay": 0.0}),
    ("Lamb", {}, False, "Lamb", LAMB),
    ("OneBitAdam", {}, False, "OnebitAdam", ONEBIT),
    # given values still win over the defaults
    ("AdamW", {"weight_decay": 0.1, "lr": 0.5}, False, "AdamW", {"weight_decay": 0.1, "lr": 0.5}),
])
def test_optimizer_defaults_are_deepspeeds(name, params, offload, cls, expected):
    opt = build_optimizer(NamedConfig(name, params), [torch.nn.Parameter(torch.zeros(3))], offload=offload)
    assert type(opt).__name__ == cls
    for key, value in expected.items():
        assert opt.defaults[key] == value, key
    if name.lower() == "onebitadam":
        assert (opt.freeze_step, opt.cuda_aware, opt.comm_backend_name) == (100000, False, "nccl")
