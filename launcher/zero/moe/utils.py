"""``deepspeed.moe.utils``: telling expert parameters apart and the optimizer param groups for them."""
from launcher.zero.experts.param_groups import (configure_moe_param_groups, has_moe_layers,  # noqa: F401
                                                is_moe_param, is_moe_param_group,
                                                split_params_grads_into_shared_and_expert_params,
                                                split_params_into_different_moe_groups_for_optimizer,
                                                split_params_into_shared_and_expert_params)
