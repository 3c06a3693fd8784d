"""``deepspeed.comm``: DeepSpeed's collective API over torch.distributed.

Built in ``launcher/zero/distributed/deepspeed_comm.py``; any name not spelled out there is
torch.distributed's own (the module ``__getattr__``).
"""
from launcher.zero.distributed.deepspeed_comm import (  # noqa: F401
    ReduceOp, __getattr__, all_gather, all_gather_into_tensor, all_reduce, all_to_all_single, barrier, broadcast,
    get_local_rank, get_rank, get_world_group, get_world_size, init_distributed, is_initialized, log_summary, recv,
    reduce, reduce_scatter_tensor, send,
)
