"""``deepspeed.utils.groups``: the data-parallel and expert groups of the last ``zero.initialize``."""
from launcher.zero.experts.registry import (_get_broadcast_src_rank, _get_data_parallel_group,  # noqa: F401
                                            _get_data_parallel_group_ranks, _get_data_parallel_rank,
                                            _get_data_parallel_world_size, _get_expert_broadcast_src_rank,
                                            _get_expert_data_parallel_group, _get_expert_data_parallel_group_dict,
                                            _get_expert_data_parallel_group_ranks, _get_expert_data_parallel_rank,
                                            _get_expert_data_parallel_world_size, _get_expert_parallel_group,
                                            _get_expert_parallel_group_dict, _get_expert_parallel_group_ranks,
                                            _get_expert_parallel_rank, _get_expert_parallel_src_rank,
                                            _get_expert_parallel_world_size, _get_max_expert_parallel_group,
                                            _get_max_expert_size, _get_max_expert_size_name,
                                            _get_model_parallel_world_size)
from launcher.zero.shim.stand_ins import (_get_sequence_parallel_group, _get_sequence_parallel_rank,  # noqa: F401
                                          _get_sequence_parallel_world_size)
