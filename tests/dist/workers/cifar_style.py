"""A training script in the style of DeepSpeed's CIFAR-10 tutorial, written against DeepSpeed's API.

It is run by tests/dist/test_deepspeed_script.py two ways: with its imports changed by the
README's porting rule (nothing else edited), and unchanged under ``dslaunch --as-deepspeed``.
Synthetic 3x8x8 images stand in for CIFAR-10 (no download). Prints ``RESULT {json}`` per epoch.
"""
import argparse
import json

import deepspeed
import deepspeed.comm as dist
import torch
import torch.nn as nn
import torch.nn.functional as F
from deepspeed.accelerator import get_accelerator


def add_argument():
    parser = argparse.ArgumentParser(description="CIFAR")
    parser.add_argument("-e", "--epochs", default=2, type=int, help="number of total epochs")
    parser.add_argument("--local_rank", type=int, default=-1, help="local rank passed from distributed launcher")
    parser.add_argument("--save_dir", required=True, help="checkpoint folder")
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3)
        self.pool = nn.MaxPool2d(2, 2)
        self.fc1 = nn.Linear(6 * 3 * 3, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = torch.flatten(x, 1)
        return self.fc2(F.relu(self.fc1(x)))


def synthetic_cifar(n=128):
    gen = torch.Generator().manual_seed(0)
    images = torch.randn(n, 3, 8, 8, generator=gen)
    labels = (images[:, 0].mean(dim=(1, 2)) > 0).long() + 2 * (images[:, 1].mean(dim=(1, 2)) > 0).long()
    return torch.utils.data.TensorDataset(images, labels)


def main():
    args = add_argument()
    deepspeed.init_distributed()
    torch.manual_seed(0)
    if dist.get_rank() != 0:
        dist.barrier()           # rank 0 prepares the data first, as the tutorial downloads it
    trainset = synthetic_cifar()
    if dist.get_rank() == 0:
        dist.barrier()
    net = Net()
    parameters = filter(lambda p: p.requires_grad, net.parameters())
    model_engine, optimizer, trainloader, __ = deepspeed.initialize(
        args=args, model=net, model_parameters=parameters, training_data=trainset)
    local_device = get_accelerator().device_name(model_engine.local_rank)
    target_dtype = None
    if model_engine.bfloat16_enabled():
        target_dtype = torch.bfloat16
    elif model_engine.fp16_enabled():
        target_dtype = torch.half
    criterion = nn.CrossEntropyLoss()
    load_path, client_state = model_engine.load_checkpoint(args.save_dir)
    start = client_state["epoch"] + 1 if client_state else 0
    for epoch in range(start, args.epochs):
        running_loss = 0.0
        for i, data in enumerate(trainloader):
            inputs, labels = data[0].to(local_device), data[1].to(local_device)
            if target_dtype is not None:
                inputs = inputs.to(target_dtype)
            outputs = model_engine(inputs)
            loss = criterion(outputs, labels)
            model_engine.backward(loss)
            model_engine.step()
            running_loss += loss.item()
        print("RESULT " + json.dumps({"rank": dist.get_rank(), "epoch": epoch, "loss": running_loss / (i + 1),
                                      "steps": model_engine.global_steps, "resumed_from": load_path,
                                      "dtype": str(target_dtype), "lr": model_engine.get_lr()[0]}), flush=True)
        model_engine.save_checkpoint(args.save_dir, client_state={"epoch": epoch})
    dist.log_summary()


if __name__ == "__main__":
    main()
