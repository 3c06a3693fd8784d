"""Stage 3's checkpoint side: fragments of the flat masters, the gathered module state dict
and its load, and the 16-bit save. A mixin of Stage3Strategy (stage3/strategy.py), which owns the
masters, slots and the parameter coordinator it reads."""
from __future__ import annotations

from typing import Any

import torch

from launcher.zero.errors import ConfigError
from launcher.zero.stages.base import Fragment
from launcher.zero.stages.stage3 import params as P


class Stage3State:
    """Checkpoint methods of the stage-3 strategy (see the module docstring)."""

    # ---- checkpoints ----------------------------------------------------------------------
    def fragments(self) -> list[Fragment]:
        found = []
        for position, (slots, master) in enumerate(zip(self.group_slots, self.masters)):
            index = self._group_index(position)
            for slot in slots:
                if slot.covered > 0:
                    found.append(Fragment(name=slot.name, group=index, master=master, master_offset=slot.offset,
                                          param_start=slot.param_start, numel=slot.covered, shape=slot.shape))
        return found

    def grad_of(self, fragment: Fragment) -> torch.Tensor:
        position = next(i for i, master in enumerate(self.masters) if master is fragment.master)
        return self.grads[position]

    def _group_index(self, position: int) -> int:
        masters = {id(m): i for i, g in enumerate(self.optimizer.param_groups) for m in g["params"]}
        return masters[id(self.masters[position])]

    def module_state_dict(self) -> dict[str, Any]:
        """The full state dict, gathered parameter by parameter (collective: call on every rank)."""
        gathered: dict[int, torch.Tensor] = {}
        for p in self.module.parameters():
            if P.is_partitioned(p):
                self.coordinator.fetch([p])
                gathered[id(p)] = p.detach().clone()
                self.coordinator.release(p)
        # state_dict(keep_vars=True) names every alias of a tied parameter; map them by identity
        return {key: gathered[id(value)] if id(value) in gathered else value.detach().clone()
                for key, value in self.module.state_dict(keep_vars=True).items()}

    def load_module_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        params = dict(self.module.named_parameters())
        buffers = dict(self.module.named_buffers())
        # what a state dict holds: no non-persistent buffer (a rotary embedding's inv_freq, say)
        missing = [k for k in self.module.state_dict(keep_vars=True) if k not in state]
        if strict and missing:
            raise ConfigError(f"load_module_state_dict: missing keys {missing[:5]}",
                              hint="load a checkpoint of the same model, or pass load_module_strict=False")
        with torch.no_grad():
            for name, p in params.items():
                if name not in state:
                    continue
                value = state[name].to(device=self.context.dist_context.device)
                if P.is_partitioned(p):
                    P.update_shard_from_full(p, value.to(p.ds_state.shard.dtype))
                else:
                    p.data.copy_(value.view_as(p.data))
            for name, b in buffers.items():
                if name in state:
                    b.data.copy_(state[name])
        self._refresh_masters_from_params()

    def _refresh_masters_from_params(self) -> None:
        if self.nvme is not None and not self._nvme_resident:   # the masters are in files
            for position, (params, slots) in enumerate(zip(self.group_params, self.group_slots)):
                for p, slot in zip(params, slots):
                    self.nvme.write_master(position, slot.offset,
                                           p.data.reshape(-1) if slot.persistent else P.shard_values(p.ds_state))
            return
        with torch.no_grad():
            for params, slots, master in zip(self.group_params, self.group_slots, self.masters):
                for p, slot in zip(params, slots):
                    source = p.data.reshape(-1) if slot.persistent else P.shard_values(p.ds_state)
                    view = master[slot.offset:slot.offset + slot.length]
                    if source.data_ptr() != view.data_ptr():
                        view.copy_(source)

    # ---- 16-bit save ----------------------------------------------------------------------
    def gathered_16bit_state_dict(self) -> dict[str, Any] | None:
        """For ``engine.save_16bit_model``: the consolidated model-dtype state dict; collective.

        Returns None (on every rank, nothing gathered) unless
        ``stage3_gather_16bit_weights_on_model_save`` is set: DeepSpeed then saves nothing and
        returns False, instead of writing a file of empty placeholders.
        """
        if not self.context.config.zero_optimization.stage3_gather_16bit_weights_on_model_save:
            return None
        return self.module_state_dict()

