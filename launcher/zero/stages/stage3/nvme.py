"""Stage 3's side of the optimizer-state NVMe offload (``offload_optimizer.device: nvme``):
the folder and chunk size at set-up, each group's master to its files, the updated chunks to the
parameters, the states read whole for checkpoints, and the start line. The files and the feed
the CPU Adam steps through are in stages/nvme_states.py."""
from __future__ import annotations

import contextlib

import torch

from launcher.zero.stages.nvme_states import MOMENTS, NvmeStates, check_folder
from launcher.zero.stages.stage3 import params as P
from launcher.zero.stages.stage3.nvme_params import ParamFiles
from launcher.zero.errors import ConfigError, NvmeOffloadError

#: elements of the widest vector the CPU Adam kernel uses (AVX-512 fp32 x 4): NVMe chunks are multiples
_VECTOR = 64



class Stage3Nvme:
    """Mixed into Stage3Strategy: ``self.nvme`` is None unless the optimizer states go to NVMe."""

    def _start_nvme(self, zero, optimizer):
        """offload_optimizer.device nvme: this rank's folder checked, chunks sized to the buffers."""
        offload = zero.offload_optimizer
        if not (self.offload_optimizer and offload.device == "nvme"):
            return None
        if not hasattr(optimizer, "state_feed"):
            raise ConfigError(f"zero_optimization.offload_optimizer.device 'nvme' steps with the engine's CPU Adam, "
                              f"not {type(optimizer).__name__}",
                              hint='use the config\'s "optimizer": {"type": "AdamW", ...} or '
                                   'launcher.zero.optim.cpu_adam.CPUAdam')
        folder = check_folder(offload.nvme_path, self.context.dist_context.rank)
        # a slot holds one chunk of the master and both moments: buffer_count x buffer_size elements in
        # all (DeepSpeed sizes its swap buffers by the largest sub group: sub_group_size caps a chunk too)
        chunk = max(1, min(int(optimizer.chunk_elements), int(zero.sub_group_size), int(offload.buffer_size) // 3))
        if chunk >= _VECTOR:   # whole vectors a chunk: the kernel's arithmetic then matches one call's
            chunk -= chunk % _VECTOR
        optimizer.chunk_elements = chunk
        return NvmeStates(folder, chunk, int(offload.buffer_count))

    def _start_param_files(self, zero) -> ParamFiles | None:
        """offload_param.device nvme: this rank's folder checked now (the shards go to it once the
        masters are built: ParamFiles.adopt); else None."""
        offload = zero.offload_param
        if offload is None or offload.device != "nvme":
            return None
        if zero.offload_optimizer is not None and zero.offload_optimizer.overlap_step:
            raise ConfigError("zero_optimization.offload_optimizer.overlap_step with offload_param.device 'nvme': "
                              "the background step would write the parameters' file while the next forward "
                              "reads it", hint="remove overlap_step, or use offload_param.device 'cpu'")
        folder = check_folder(offload.nvme_path, self.context.dist_context.rank, section="offload_param")
        return ParamFiles(folder, offload.buffer_count, offload.buffer_size, offload.pin_memory)

    def _master_to_files(self, master, optimizer, nvme_path: str) -> torch.Tensor:
        """nvme: a group's master and zero moments written whole now (the disk space reserved before
        training: a disk too small refuses the start, not a later step)."""
        try:
            return self.nvme.add_group(master, optimizer.moment_dtype(master))
        except NvmeOffloadError as error:
            raise ConfigError(f"zero_optimization.offload_optimizer.nvme_path {nvme_path!r}: {error}",
                              hint=f"free space there or pick another folder: this rank's states need at least "
                                   f"{self.nvme.disk_bytes()} bytes") from None

    def _copy_chunk(self, position: int, start: int, end: int, values: torch.Tensor) -> None:
        """nvme: an updated master chunk (a host slot, reused next) -> the model's parameters now."""
        flat = self.flat_params[position]
        with torch.no_grad():
            if flat is not None:
                flat[start:end].copy_(values)
                return
            for p, slot in zip(self.group_params[position], self.group_slots[position]):
                low, high = max(start, slot.offset), min(end, slot.offset + slot.length)
                if low < high and not slot.persistent and p.ds_state.swap is not None:   # offload_param nvme
                    p.ds_state.swap.write(p.ds_state, values[low - start:high - start], low - slot.offset)
                elif low < high:
                    target = p.data.view(-1) if slot.persistent else p.ds_state.shard
                    target[low - slot.offset:high - slot.offset].copy_(values[low - start:high - start])

    def nvme_summary(self) -> str | None:
        """The start lines of NVMe offload: where the parameters and the states go, bytes on disk per
        parameter, host buffers."""
        lines = [] if self.param_files is None else [self.param_files.summary(
            sum(p.ds_state.shard_numel for p in dict.fromkeys(self.module.parameters()) if P.is_partitioned(p)))]
        if self.nvme is not None:
            lines.append(self._states_summary())
        return "\n".join(lines) or None

    def _states_summary(self) -> str:
        nvme, numel = self.nvme, sum(m.numel() for m in self.masters)
        kinds = nvme.groups[0] if nvme.groups else {}
        names = " + ".join(f"{k} {dtype}".replace("torch.", "") for k, (_, dtype, _) in kinds.items())
        slot_bytes = nvme.chunk_numel * sum(dtype.itemsize for _, dtype, _ in kinds.values())
        return (f"NVMe offload: optimizer states ({names}) in {nvme.folder} (one folder per rank), "
                f"{nvme.disk_bytes() / max(1, numel):.1f} bytes on disk per parameter ({nvme.disk_bytes()} bytes for "
                f"this rank's {numel} elements); host memory for them: {nvme.buffer_count} slots (buffer_count) of "
                f"{nvme.chunk_numel} elements (a third of buffer_size: master and 2 moments a slot; at most sub_group_size), at most "
                f"{nvme.buffer_count * slot_bytes} bytes; the next chunks are read and the last written back on "
                "one thread while a chunk updates (pipeline_read/pipeline_write are always on)")

    @contextlib.contextmanager
    def states_resident(self, write_back: bool):
        """nvme: the masters and moments read whole into host memory for a checkpoint (DeepSpeed swaps
        them in to save too), and written back on exit with ``write_back`` (a load); else nothing."""
        if self.nvme is None or self._nvme_resident:
            yield
            return
        placeholders = [master.data for master in self.masters]
        for position, master in enumerate(self.masters):
            values = self.nvme.read_group(position)
            master.data = values["master"]
            state = self.optimizer.state[master]
            if "step" in state:   # before the first step the CPU Adam has no state (and saves none)
                state.update({key: values[key] for key in MOMENTS})
        self._nvme_resident = True
        try:
            yield
            if write_back:
                for position, master in enumerate(self.masters):
                    state = self.optimizer.state.get(master, {})
                    self.nvme.write_group(position, {"master": master.data,
                                                     **{key: state.get(key) for key in MOMENTS}})
        finally:
            self._nvme_resident = False
            for master, placeholder in zip(self.masters, placeholders):
                for key in MOMENTS:
                    self.optimizer.state.get(master, {}).pop(key, None)
                master.data = placeholder

