"""The ``compile`` config section and ``engine.compile()`` on one rank: the keys DeepSpeed users
write load (and 0.19.8's DeepCompile keys only at their defaults), what compiled code cannot keep
is refused by name, and a compiled engine trains (2-rank parity: tests/dist/test_engine_compile_ranks.py)."""
import pytest
import torch

from launcher import zero
from launcher.zero.config.load import load_config, no_effect_notes
from launcher.zero.errors import ConfigError, NotSupportedError


@pytest.fixture(autouse=True)
def no_process_group_left():
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def cfg(stage=0, compile_section=None, **zero_extra):
    c = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": stage, **zero_extra},
         "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, "steps_per_print": 10**9}
    if compile_section is not None:
        c["compile"] = compile_section
    return c


def test_the_compile_section_loads_with_its_defaults_and_is_no_longer_a_no_effect_section():
    c = load_config({"train_batch_size": 8, "compile": {"enabled": True, "backend": "eager",
                                                        "kwargs": {"mode": "max-autotune"}, "deepcompile": False}})
    assert (c.compile.enabled, c.compile.backend, c.compile.kwargs) == (True, "eager", {"mode": "max-autotune"})
    assert not any("compile" in note for note in no_effect_notes(c))
    d = load_config({"train_batch_size": 8}).compile
    assert (d.enabled, d.backend, d.kwargs) == (False, "inductor", {})


@pytest.mark.parametrize("section,named", [({"deepcompile": True}, "compile.deepcompile"),
                                           ({"passes": ["z3"]}, "compile.passes"),
                                           ({"offload_opt_states": True}, "compile.offload_opt_states")])
def test_deepcompile_keys_are_refused_by_name(section, named):
    with pytest.raises(NotSupportedError, match=named):
        load_config({"train_batch_size": 8, "compile": section})


def test_a_backend_inside_kwargs_and_a_misspelt_key_are_config_errors():
    with pytest.raises(ConfigError, match="compile.kwargs.backend"):
        load_config({"train_batch_size": 8, "compile": {"enabled": True, "kwargs": {"backend": "eager"}}})
    with pytest.raises(ConfigError, match="compile.enable") as error:
        load_config({"train_batch_size": 8, "compile": {"enable": True}})
    assert "did you mean 'compile.enabled'" in error.value.hint


def overlap_config(compile_section=None):
    return cfg(2, compile_section, offload_optimizer={"device": "cpu", "overlap_step": True})


def test_compile_with_overlap_step_is_refused_naming_it():
    def model():
        return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    with pytest.raises(NotSupportedError, match="offload_optimizer.overlap_step"):
        zero.initialize(model=model(), config=overlap_config({"enabled": True, "backend": "eager"}))
    torch.distributed.destroy_process_group()
    engine, _, _, _ = zero.initialize(model=model(), config=overlap_config())
    with pytest.raises(NotSupportedError, match="offload_optimizer.overlap_step"):
        engine.compile(backend="eager")
    assert not engine.is_compiled
    with pytest.raises(NotSupportedError, match="schedule"):
        engine.compile(backend="eager", schedule=[(0, ["prefetch"])])
    engine.destroy()


def test_engine_compile_trains_once_and_a_kwargs_backend_gives_way(capsys):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    engine, _, _, _ = zero.initialize(model=model, config=cfg(1))
    assert not engine.is_compiled
    torch._dynamo.reset()
    engine.compile(backend="eager", compile_kwargs={"backend": "inductor"})
    assert engine.is_compiled and "forward" in model.__dict__
    assert "compile_kwargs backend 'inductor' is overridden by backend='eager'" in capsys.readouterr().out
    x = torch.randn(4, 8)
    first = None
    for _ in range(3):
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
        first = float(loss.detach()) if first is None else first
    assert float(loss.detach()) < first
    engine.destroy()
    assert "forward" not in model.__dict__
