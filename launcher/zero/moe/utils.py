"""``deepspeed.moe.utils``: the helpers scripts import; each raises ``NotSupportedError`` when called."""
from launcher.zero.moe import not_built


def is_moe_param(param) -> bool:
    raise not_built("deepspeed.moe.utils.is_moe_param")


def split_params_into_different_moe_groups_for_optimizer(param_groups, *args, **kwargs):
    raise not_built("deepspeed.moe.utils.split_params_into_different_moe_groups_for_optimizer")


def split_params_into_shared_and_expert_params(params):
    raise not_built("deepspeed.moe.utils.split_params_into_shared_and_expert_params")
