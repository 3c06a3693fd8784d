"""Build the scheduler named in the config: ours first (DeepSpeed's names), then torch's."""
from __future__ import annotations

from launcher.zero.errors import ConfigError
from launcher.zero.sched.schedulers import SCHEDULERS


def build_scheduler(optimizer, spec):
    """A scheduler from a NamedConfig(type, params); unknown names and bad params are ConfigErrors."""
    cls = SCHEDULERS.get(spec.type)
    if cls is None:
        import torch.optim.lr_scheduler as torch_schedulers

        cls = getattr(torch_schedulers, spec.type, None)
        if not isinstance(cls, type):
            known = sorted(SCHEDULERS) + ["any torch.optim.lr_scheduler class"]
            raise ConfigError(f"scheduler.type: unknown scheduler '{spec.type}'", hint=f"use one of {', '.join(known)}")
    try:
        return cls(optimizer, **spec.params)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"scheduler.params: {spec.type}: {error}",
                          hint=f"check the arguments of {spec.type} (and required ones such as total_num_steps)") from None
