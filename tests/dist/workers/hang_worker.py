"""A plain torch.distributed script (no engine, no beat()) that hangs as issue 42 tells it: at step 2
rank 1 sleeps inside its data loader (a file system that stopped answering) while rank 0 waits for it
in all_reduce. No rank moves and nothing is printed: only --stall_timeout's quiet-job watch sees it.
argv[1], if given, names another rank to get stuck (the cluster test's rank 3 on node2)."""
import sys
import time

import torch
import torch.distributed as dist


STUCK_RANK = int(sys.argv[1]) if len(sys.argv) > 1 else 1


def load_batch(step):
    if step == 2 and dist.get_rank() == STUCK_RANK:
        print(f"rank {STUCK_RANK}: loading the batch of step 2", flush=True)
        time.sleep(1000)
    return torch.ones(4)


def main():
    dist.init_process_group("gloo")
    for step in range(5):
        batch = load_batch(step)
        dist.all_reduce(batch)
        print(f"step {step} done", flush=True)
    dist.destroy_process_group()
    print("finished", flush=True)


main()
