"""Lift Lightning's "DeepSpeed needs CUDA" guard, identically under a real DeepSpeed and dslaunch's engine.

Lightning's ``DeepSpeedStrategy`` (Fabric's and the Trainer's) refuses every accelerator but CUDA in
``setup_environment``; it also wants device indices equal to the local ranks and hands
``deepspeed.initialize`` ``args.device_rank = root_device.index``, which is None for
``torch.device("cpu")`` (DeepSpeed then compares ``None >= 0``). Two patches and nothing else, made
before the strategy is built: ``setup_environment`` goes straight to the parent class's (the DDP
strategy's: process group, ranks), and the strategy's CPU devices are numbered ``cpu:0``, ``cpu:1``,
... (torch keeps a tensor on ``cpu`` whatever the index; DeepSpeed's CPU accelerator ignores it).
Everything the strategy does with DeepSpeed after that is Lightning's own code, unchanged.
"""
from __future__ import annotations

import torch


def lift(strategy_class: type) -> None:
    """Patch one of Lightning's ``DeepSpeedStrategy`` classes (fabric's or pytorch's) as described above."""
    parent_setup = strategy_class.__mro__[1].setup_environment

    def setup_environment(self) -> None:
        parent_setup(self)

    devices = next(vars(c)["parallel_devices"] for c in strategy_class.__mro__ if "parallel_devices" in vars(c))

    def number_cpus(self, given) -> None:
        numbered = None if given is None else [torch.device("cpu", index) if device.type == "cpu" else device
                                               for index, device in enumerate(given)]
        devices.fset(self, numbered)

    strategy_class.setup_environment = setup_environment
    strategy_class.parallel_devices = property(devices.fget, number_cpus)


def lift_all() -> None:
    from lightning.fabric.strategies import DeepSpeedStrategy as FabricDeepSpeed
    from lightning.pytorch.strategies import DeepSpeedStrategy as TrainerDeepSpeed

    lift(FabricDeepSpeed)
    lift(TrainerDeepSpeed)
