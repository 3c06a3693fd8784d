"""A real all-reduce across every rank: `dslaunch --num_gpus 2 examples/hello_dist.py`."""
import argparse
import os
import socket

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    parser.parse_args()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    value = torch.tensor([float(rank + 1)], device=device)
    dist.all_reduce(value)
    expected = world_size * (world_size + 1) / 2
    print(f"rank {rank}/{world_size} on {socket.gethostname()}: all_reduce sum = {value.item():.0f} "
          f"(expected {expected:.0f})", flush=True)
    dist.destroy_process_group()
    if value.item() != expected:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
