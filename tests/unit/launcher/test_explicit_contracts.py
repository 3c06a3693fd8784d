"""Explicit contracts (issue 40 item 5): no ``getattr(x, "name", default)`` on our own types.

A default on ``getattr`` says "this object may lack the attribute". For our own classes that is an
implicit protocol: the attribute belongs in the constructor, or the method in the base class
(stages/base.py declares every strategy method, a runner module declares ``PER_NODE``). What may
legitimately lack an attribute is someone else's object: the user's model, optimizer, scheduler,
sampler or ``args``, torch's objects across versions, attributes other code sets on parameters
and modules (``ds_state``, ``tensor_model_parallel``). Each such call is listed below, keyed by file,
object and attribute, with the reason the attribute may be missing; a new call that is not listed
fails here.
"""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "launcher"

USER_OPTIMIZER = "the client's optimizer: ours has it, a torch or user optimizer may not"
ON_PARAMETER = "an attribute set on torch parameters by stage 3, MoE or tensor-parallel code, absent on plain ones"
ON_MODULE = "an attribute a user sets on a torch module (deepspeed.utils.set_z3_leaf_modules), absent on the rest"
HOST = "preflight takes any host object with .name (a planning Host, a test's SimpleNamespace); user/port are optional"
COORD = "a topology's coordinate has only the axes it was built with (PipeDataParallelTopology has no 'model')"

ALLOWED = {
    # ---- the user's objects ---------------------------------------------------------------------
    "zero/assembly/initialize.py: getattr(optimizer, 'handles_gradient_communication')": USER_OPTIMIZER,
    "zero/assembly/initialize.py: getattr(args, 'deepspeed_config')": "the user's argparse namespace (--deepspeed_config)",
    "zero/assembly/initialize.py: getattr(args, 'deepscale_config')": "the user's argparse namespace (the old flag)",
    "zero/distributed/parallel_layout.py: getattr(mpu, 'get_model_parallel_rank')": "the user's Megatron-style mpu object",
    "zero/distributed/parallel_layout.py: getattr(mpu, name)": "the user's mpu: which of its methods exist is checked here",
    "zero/distributed/parallel_layout.py: getattr(mpu, f'get_{name}_parallel_{what}')":
        "the user's mpu: a pipe or sequence axis is read where it has one",
    "zero/checkpoint/save_load.py: getattr(engine.basic_optimizer, 'extra_state_dict')": USER_OPTIMIZER,
    "zero/checkpoint/save_load.py: getattr(engine.basic_optimizer, 'moment_dtype')": USER_OPTIMIZER,
    "zero/checkpoint/save_load.py: getattr(engine.basic_optimizer, 'load_extra_state_dict')": USER_OPTIMIZER,
    "zero/checkpoint/save_load.py: getattr(engine.training_dataloader, 'position')":
        "the training data loader may be the user's (initialize(training_data=) builds ours)",
    "zero/data/loader.py: getattr(self.data_sampler, 'start')": "the user's data_sampler (ours resumes mid-epoch)",
    "zero/data/loader.py: getattr(self.data_sampler, 'epoch')": "the user's data_sampler (DistributedSampler has epoch)",
    "zero/engine/zero_engine.py: getattr(self.lr_scheduler, 'total_num_steps')":
        "the user's scheduler; DeepSpeed's WarmupDecayLR carries total_num_steps",
    "zero/sched/schedulers.py: getattr(optimizer, 'defaults')": "the user's optimizer (torch's carry defaults)",
    "zero/stages/whole_params.py: getattr(optimizer, 'prepare_step')": USER_OPTIMIZER,
    "zero/pipeline/module.py: getattr(layer, '__name__')": "a user's pipeline layer: a module, a function or a lambda",
    "zero/distributed/context.py: getattr(value, '__defaults__')": "a user's mpu callable (a function has __defaults__)",
    # ---- attributes set on torch parameters and modules ------------------------------------------
    "zero/assembly/initialize.py: getattr(p, 'ds_numel')": ON_PARAMETER,
    "zero/distributed/parallel_layout.py: getattr(param, 'tensor_model_parallel')": ON_PARAMETER,
    "zero/checkpoint/pipeline_save_load.py: getattr(p, 'tensor_model_parallel')": ON_PARAMETER,
    "zero/engine/estimate.py: getattr(p, 'ds_numel')": ON_PARAMETER,
    "zero/engine/fragment_access.py: getattr(param, _ENGINE_ATTRIBUTE)":
        "the engine a parameter belongs to, set on torch parameters; a parameter of no engine has none",
    "zero/experts/wiring.py: getattr(tensor, 'group_name')": ON_PARAMETER,
    "zero/experts/wiring.py: getattr(param, 'group_name')": ON_PARAMETER,
    "zero/optim/muon.py: getattr(param, 'ds_shape')": ON_PARAMETER,
    "zero/pipeline/stage_strategy.py: getattr(param, 'tensor_model_parallel')": ON_PARAMETER,
    "zero/stages/stage3/coordinator.py: getattr(value, 'ds_state')": ON_PARAMETER + " (or any forward output)",
    "zero/stages/stage3/coordinator.py: getattr(tensor, 'ds_state')": ON_PARAMETER,
    "zero/stages/stage3/params.py: getattr(item, 'ds_state')": ON_PARAMETER + " (or any forward output)",
    "zero/stages/stage3/coordinator.py: getattr(p, 'ds_state')": ON_PARAMETER,
    "zero/stages/stage3/init_context.py: getattr(p, 'ds_after_modify')": ON_PARAMETER,
    "zero/stages/stage3/params.py: getattr(param, 'ds_state')": ON_PARAMETER,
    "zero/stages/stage3/coordinator.py: getattr(m, '_z3_leaf')": ON_MODULE,
    "zero/stages/stage3/grad_reduce.py: getattr(m, '_z3_leaf')": ON_MODULE,
    "zero/stages/stage3/leaf_modules.py: getattr(module, '_z3_leaf')": ON_MODULE,
    "zero/stages/stage3/tiled_linear.py: getattr(other, 'bias')": "a user's torch module: nn.Linear(bias=False) has None",
    # ---- torch, Python and other modules across versions ------------------------------------------
    "zero/engine/zero_engine.py: getattr(torch, 'OutOfMemoryError')": "torch < 2.1 has only torch.cuda.OutOfMemoryError",
    "zero/distributed/collectives.py: getattr(dist, 'all_gather_single')": "an optional torch.distributed API",
    "zero/distributed/collectives.py: getattr(dist, 'reduce_scatter_single')": "an optional torch.distributed API",
    "zero/distributed/deepspeed_comm.py: getattr(_dist, name)": "deepspeed.comm's names that torch.distributed may have",
    "zero/optim/factory.py: getattr(torch.optim, spec.type)": "a config's optimizer name looked up in torch.optim",
    "zero/sched/by_name.py: getattr(torch_schedulers, spec.type)": "a config's scheduler name looked up in torch",
    "zero/flops/counter.py: getattr(op, '__name__')": "a torch op: overloads and Python callables name themselves apart",
    "zero/stages/host_memory.py: getattr(result, 'value')": "a ctypes result: a c_int has .value, a plain int not",
    "zero/failure.py: getattr(sys.excepthook, '_dslaunch_rank')": "whatever sys.excepthook is: ours carries the mark",
    "zero/checkpoint/deepspeed_layout.py: getattr(obj, 'deepspeed_path')":
        "any class being pickled: only our stand-ins for DeepSpeed's classes carry it",
    "preflight/remote_probe.py: getattr(launcher, '__version__')": "the dslaunch installed on a remote host, any version",
    "preflight/remote_probe.py: getattr(launcher, '__file__')": "a namespace package has no __file__",
    "preflight/local.py: getattr(host, 'name')": HOST,
    "preflight/local.py: getattr(host, 'user')": HOST,
    "preflight/run.py: getattr(host, 'port')": HOST,
    "preflight/run.py: getattr(host, 'user')": HOST,
    "preflight/run.py: getattr(s.host, 'port')": HOST,
    # ---- our own types, left to the branch that rewrites them ------------------------------------
    "zero/parallel/grid.py: getattr(coord, 'pipe')": COORD,
    "zero/parallel/grid.py: getattr(coord, 'data')": COORD,
    "zero/parallel/grid.py: getattr(coord, 'model')": COORD,
}


def getattr_with_default() -> list[str]:
    """Every ``getattr(obj, name, default)`` in launcher/, as 'file: getattr(obj, name)'."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                    and len(node.args) == 3:
                found.append(f"{where}: getattr({ast.unparse(node.args[0])}, {ast.unparse(node.args[1])})")
    return found


def test_no_getattr_with_a_default_on_our_own_types():
    unlisted = sorted(set(getattr_with_default()) - set(ALLOWED))
    assert unlisted == [], ("getattr with a default on an object that may be our own: set the attribute in the "
                            "constructor or declare it on the base class, or list it here with the reason "
                            f"it may be missing: {unlisted}")


def test_every_allowed_getattr_has_a_reason():
    assert all(isinstance(reason, str) and reason.strip() for reason in ALLOWED.values())


def test_the_strategy_protocol_is_not_probed_anywhere():
    """Nothing in launcher/ asks a strategy whether it has a method (stages/base.py declares them all)."""
    probes = [entry for entry in getattr_with_default() if "strategy" in entry.split("getattr(")[1].split(",")[0]]
    assert probes == []


def test_every_allowed_getattr_is_still_there():
    """A call that went away leaves no stale entry behind (the list stays the truth about launcher/)."""
    stale = sorted(set(ALLOWED) - set(getattr_with_default()))
    assert stale == [], f"listed here but no longer in launcher/: remove them from ALLOWED: {stale}"
