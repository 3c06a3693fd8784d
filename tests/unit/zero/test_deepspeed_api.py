"""DeepSpeed's API names that scripts call, one by one (issue 17, items 5-10)."""
import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from launcher import zero
from launcher.zero.errors import ConfigError, NotSupportedError

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def no_process_group_left():
    """Engines here start a one-rank group in the pytest process; other tests start their own."""
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def test_add_config_arguments_adds_deepspeeds_flags():
    parser = zero.add_config_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--deepspeed", "--deepspeed_config", "ds.json"])
    assert args.deepspeed is True and args.deepspeed_config == "ds.json"
    assert parser.parse_args([]).deepspeed is False and parser.parse_args([]).deepspeed_config is None


def test_initialize_reads_args_and_refuses_two_configs(tmp_path):
    cfg = tmp_path / "ds.json"
    cfg.write_text('{"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Adam"}}')
    args = zero.add_config_arguments(argparse.ArgumentParser()).parse_args(["--deepspeed_config", str(cfg)])
    engine, *_ = zero.initialize(args=args, model=torch.nn.Linear(2, 2))
    assert engine.optimizer.param_groups[0]["weight_decay"] == 0.0
    with pytest.raises(ConfigError, match="both as config= and as args.deepspeed_config"):
        zero.initialize(args=args, model=torch.nn.Linear(2, 2), config={"train_micro_batch_size_per_gpu": 1})


def test_engine_accessors_scripts_call():
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3, "gradient_clipping": 0.5,
              "bf16": {"enabled": True}, "zero_optimization": {"stage": 2},
              "optimizer": {"type": "AdamW", "params": {"lr": 0.1}},
              "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4}}}
    engine, *_ = zero.initialize(model=torch.nn.Linear(4, 2), config=config)
    assert engine.bfloat16_enabled() and engine.bf16_enabled() and not engine.fp16_enabled()
    assert not engine.amp_enabled() and engine.zero_optimization() and not engine.zero_offload_optimizer()
    assert engine.gradient_clipping() == 0.5 and engine.optimizer_name() == "AdamW"
    assert engine.scheduler_name() == "WarmupLR" and engine.communication_data_type == torch.bfloat16
    assert engine.get_data_types() == (torch.bfloat16, engine.precision.grad_accum_dtype)
    assert engine.dp_world_size == 1 and engine.mp_world_size == 1
    state = engine.module_state_dict(prefix="m.")
    assert set(state) == {"m.weight", "m.bias"}
    assert engine.save_fp16_model == engine.save_16bit_model
    loader = engine.deepspeed_io(torch.utils.data.TensorDataset(torch.zeros(6, 4)))
    assert [len(batch[0]) for batch in loader] == [2, 2, 2]
    engine.destroy()
    assert not any(p._post_accumulate_grad_hooks for p in engine.module.parameters())


def test_comm_over_torch_distributed():
    from launcher.zero import comm

    comm.init_distributed(dist_backend="gloo")
    assert comm.is_initialized() and comm.get_rank() == 0 and comm.get_world_size() == 1
    tensor = torch.ones(3)
    comm.all_reduce(tensor, op=comm.ReduceOp.SUM, prof=True, log_name="x")   # DeepSpeed's extra keywords
    comm.barrier()
    assert tensor.tolist() == [1.0, 1.0, 1.0]
    assert comm.get_backend() == "gloo"       # anything else is torch.distributed's own
    comm.log_summary()


def test_accelerator_on_cpu():
    from launcher.zero.accelerator import Accelerator

    cpu = Accelerator(cuda=False)
    assert cpu.device_name() == "cpu" and cpu.device_name(3) == "cpu" and cpu.device(1) == torch.device("cpu")
    assert cpu.communication_backend_name() == "gloo" and cpu.is_available()
    cpu.manual_seed(7)
    first = torch.rand(2)
    cpu.manual_seed_all(7)
    assert torch.equal(first, torch.rand(2))
    cpu.synchronize()
    cpu.empty_cache()
    assert cpu.memory_allocated() == 0 and cpu.on_accelerator(torch.zeros(1))
    with cpu.stream(cpu.Stream()):
        cpu.Event().record()
    gpu = Accelerator(cuda=True)
    assert gpu.device_name() == "cuda" and gpu.device_name(1) == "cuda:1"
    assert gpu.communication_backend_name() == "nccl"
    assert zero.accelerator.get_accelerator().device_name() == ("cuda" if torch.cuda.is_available() else "cpu")


def test_utils_and_runtime_names():
    loader = zero.utils.RepeatingLoader([1, 2])
    assert [next(loader) for _ in range(5)] == [1, 2, 1, 2, 1]
    zero.utils.log_dist("hello", ranks=[0])
    from launcher.zero.runtime.utils import set_random_seed
    set_random_seed(3)
    first = torch.rand(2)
    set_random_seed(3)
    assert torch.equal(first, torch.rand(2))
    from launcher.zero.runtime.lr_schedules import WarmupLR
    assert WarmupLR is zero.runtime.lr_schedules.WarmupLR


def test_zero_namespace_and_ops():
    assert zero.zero.Init is zero.Init and zero.zero.GatheredParameters is zero.GatheredParameters
    zero.zero.register_external_parameter(torch.nn.Linear(1, 1), torch.nn.Parameter(torch.zeros(1)))
    from launcher.zero.ops.adam import DeepSpeedCPUAdam, FusedAdam
    opt = FusedAdam([torch.nn.Parameter(torch.zeros(2))])
    assert type(opt) is torch.optim.AdamW and opt.defaults["weight_decay"] == 0.0
    assert DeepSpeedCPUAdam([torch.nn.Parameter(torch.zeros(2))]).defaults["weight_decay"] == 0.0
    from launcher.zero.ops.lamb import FusedLamb
    assert FusedLamb is zero.ops.lamb.FusedLamb


def test_moe_face_is_the_experts_package_and_pipe_exports_deepspeed_names():
    import launcher.zero.moe  # noqa: F401  (DeepSpeed's tutorials import it)
    from launcher.zero.experts import MoE as InternalMoE
    from launcher.zero.moe.layer import MoE
    from launcher.zero.moe.utils import split_params_into_different_moe_groups_for_optimizer as split
    from launcher.zero.utils import groups
    assert zero.moe is launcher.zero.moe and MoE is InternalMoE
    layer = MoE(hidden_size=4, expert=torch.nn.Linear(4, 4), num_experts=2)
    groups_out = split([{"params": list(layer.parameters()), "name": "all"}])
    assert [(g["name"], g.get("moe", False)) for g in groups_out] == [("all", False), ("ep_size_1", True)]
    with pytest.raises(ConfigError, match="ep_size_9"):
        groups._get_expert_parallel_group("ep_size_9")
    import launcher.zero.pipe as pipe
    from launcher.zero.pipe import LayerSpec, PipelineModule, TiedLayerSpec  # noqa: F401
    from launcher.zero.pipe import PipeDataParallelTopology, PipeModelDataParallelTopology, ProcessTopology  # noqa: F401
    assert pipe.PipelineModule is PipelineModule and issubclass(TiedLayerSpec, LayerSpec)
    assert zero.pipe is pipe
    with pytest.raises(AttributeError):
        pipe.NoSuchThing  # noqa: B018


def test_shim_makes_deepspeed_modules_ours_not_copies():
    code = ("from launcher.zero.shim import install; install()\n"
            "import deepspeed, deepspeed.comm as c, launcher.zero, launcher.zero.comm\n"
            "from deepspeed.runtime.utils import set_random_seed\n"
            "from launcher.zero.runtime import utils\n"
            "assert deepspeed is launcher.zero and c is launcher.zero.comm and set_random_seed is utils.set_random_seed\n"
            "assert deepspeed.zero.Init is launcher.zero.Init\n"
            "print('same')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.stdout.strip() == "same", done.stderr


def test_engine_is_what_hugging_face_integrations_expect():
    """Issue 30: engine.config is the dict (Trainer.save_model calls .get on it), the engine an nn.Module
    with the model its one child (accelerate walks _modules), stage 3's 16-bit save names exist."""
    config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": float("inf"), "wandb": {"enabled": False},
              "zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}
    model = torch.nn.Linear(4, 2)
    engine, *_ = zero.initialize(model=model, config=config)
    assert engine.config.get("zero_optimization", {}).get("stage") == 2 and engine.config["wandb"] == {"enabled": False}
    assert engine.config["optimizer"]["params"]["lr"] == "auto" and engine.zero_config.zero_stage == 2
    assert isinstance(engine, torch.nn.Module) and dict(engine.named_children()) == {"module": model}
    assert list(engine.modules()) == [engine, model]
    assert engine.zero_gather_16bit_weights_on_model_save() is False
    state = engine._zero3_consolidated_16bit_state_dict()
    assert set(state) == {"weight", "bias"} and torch.equal(state["weight"], model.weight.detach())
    assert state["weight"].data_ptr() != model.weight.data_ptr()


def test_deepspeed_helpers_scripts_import_from_odd_places():
    from launcher.zero.checkpoint.tensors import clone_tensors_for_torch_save
    from launcher.zero.engine.module_paths import recursive_getattr, recursive_setattr

    flat = torch.arange(10.0)
    copied = clone_tensors_for_torch_save({"a": [flat[2:4]], "b": (flat[:1], 3)})
    assert copied["a"][0].untyped_storage().nbytes() == 8 and copied["b"][1] == 3
    assert torch.equal(copied["a"][0], torch.tensor([2.0, 3.0])) and isinstance(copied["b"], tuple)
    model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    assert recursive_getattr(model, "0.0") is model[0][0]
    recursive_setattr(model, "0.0", torch.nn.Identity())
    assert isinstance(model[0][0], torch.nn.Identity) and "0.0.weight" not in model.state_dict()


def test_deepspeed_names_not_built_import_and_say_so_where_used():
    with pytest.raises(NotSupportedError, match="init_inference: DeepSpeed inference"):
        zero.init_inference(torch.nn.Linear(2, 2))
    with pytest.raises(NotSupportedError, match="kernel"):
        zero.DeepSpeedTransformerLayer.some_class_attribute
    assert zero.__version__ == "0.19.8"
