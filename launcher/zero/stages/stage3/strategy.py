"""ZeRO stage 3: parameters, gradients and optimizer state all partitioned across ranks.

Set-up partitions every trainable parameter of at least ``stage3_param_persistence_threshold``
elements (one shard per rank, DeepSpeed's per-parameter layout) and keeps the smaller ones whole.
Each optimizer group gets one flat master on this rank (shards and persistent parameters end
to end, see layout.py). During backward a partitioned parameter's gradient is reduce-scattered
into its owner's shard as soon as autograd has accumulated it, and the full gradient and the
gathered parameter are dropped; persistent gradients are all-reduced once per boundary.

With ``offload_optimizer`` the masters, their gradients and the optimizer state live in
(pinned) host memory and the step runs on the CPU; with ``offload_param`` the shards do too.
With ``offload_optimizer.device: nvme`` the masters and Adam's moments live in files instead,
read and written a chunk at a time around the CPU Adam (nvme_states.py); ``self.masters`` then
holds placeholders of the right shape, real only inside ``states_resident`` (checkpoints).
With ``offload_param.device: nvme`` the shards live in one file per rank and each ``ds_state.shard``
is a placeholder: gathers read them, the step and any change write them (stage3/nvme_params.py).
"""
from __future__ import annotations

import torch

from launcher.zero.stages.grad_feed import GradFeed
from launcher.zero.stages.stage3.overlap import Stage3StepOverlap
from launcher.zero.stages.whole_params import _prepare_of
from launcher.zero.distributed.collectives import broadcast_from, gradient_scales
from launcher.zero.errors import ConfigError
from launcher.zero.layout.flat import trainable_groups
from launcher.zero.stages.stage3 import params as P
from launcher.zero.stages.stage3.coordinator import ParamCoordinator, Stage3Options
from launcher.zero.stages.stage3.grad_reduce import Stage3GradReduce
from launcher.zero.stages.stage3.layout import Stage3Slot, choose_persistent, plan_group
from launcher.zero.stages.partial_offload import device_params, share
from launcher.zero.optim.cpu_adam import CPUAdam
from launcher.zero.stages.stage3.square_sum import square_sum
from launcher.zero.stages.stage3.nvme import Stage3Nvme
from launcher.zero.stages.stage3.state import Stage3State
from launcher.zero.stages.host_memory import host_zeros
from launcher.zero.stages.placement import cast_divided, copy_in_pieces
from launcher.zero.stages.base import ZeroStrategy


def stage3_options(zero) -> Stage3Options:
    return Stage3Options(prefetch_bucket_size=int(zero.stage3_prefetch_bucket_size),
                         max_live_parameters=int(zero.stage3_max_live_parameters),
                         max_reuse_distance=int(zero.stage3_max_reuse_distance),
                         param_persistence_threshold=int(zero.stage3_param_persistence_threshold),
                         model_persistence_threshold=int(zero.stage3_model_persistence_threshold))


def host_buffer(numel: int, dtype: torch.dtype, pin: bool) -> torch.Tensor:
    """A zeroed CPU tensor, page-locked when asked and a GPU exists (pinning needs one), at its
    exact size (host_memory.py)."""
    return host_zeros(numel, dtype, pin)


class Stage3Strategy(Stage3GradReduce, Stage3Nvme, Stage3State, ZeroStrategy):
    """Partitioned parameters gathered per module; see the module docstring."""

    stage = 3
    partitioned_grads = True
    #: 16-bit grads whose cast to the fp32 masters waits for cast_master_grads (prepare_master_grads)
    _uncast: "list[torch.Tensor] | tuple" = ()

    @property
    def masters_on_device(self) -> bool:
        return not self.offload_optimizer

    # ---- set-up ---------------------------------------------------------------------------
    def setup(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if any(optimizer.state.values()):
            raise ConfigError("optimizer: the client optimizer already holds state",
                              hint="pass a freshly built optimizer to zero.initialize")
        ctx, zero = self.context, self.context.config.zero_optimization
        self.module, self.optimizer = module, optimizer
        self.options = stage3_options(zero)
        self.offload_optimizer = zero.offload_optimizer_active
        self.offload_param = zero.offload_param is not None and zero.offload_param.active
        pin = bool(self.offload_optimizer and zero.offload_optimizer.pin_memory)
        self.nvme, self._nvme_resident = self._start_nvme(zero, optimizer), False
        self.param_files = self._start_param_files(zero)
        host_grads, grad_dtype = self._place_gradients(zero, optimizer)
        self.master_device = torch.device("cpu") if self.offload_optimizer else ctx.dist_context.device
        self.shard_device = torch.device("cpu") if self.offload_param else ctx.dist_context.device
        self.pre_scale, self.post_scale = gradient_scales(ctx.config, ctx.dist_context.world_size)
        names = {id(p): n for n, p in module.named_parameters()}
        trainable = trainable_groups(optimizer, names)
        self._place_parameters(module, trainable)
        # full shapes by name, for checkpoints (full_shapes) and users
        self.param_shapes = {n: tuple(P.full_shape(p)) for n, p in module.named_parameters()}
        self.aliased = True
        self.group_slots: list[list[Stage3Slot]] = []
        self.flat_params: list[torch.Tensor | None] = []   # per group, see _flatten_params
        self.group_params: list[list[torch.nn.Parameter]] = []
        self.masters: list[torch.Tensor] = []
        self.grads: list[torch.Tensor] = []
        self.on_device: list[bool] = []   # per position: its optimizer state stays on the device (ratio)
        for (index, group), kept in zip(trainable, self._kept_on_device(zero, optimizer, trainable)):
            parts = [part for part in ((group[:kept], True), (group[kept:], False)) if part[0]] or [(group, False)]
            for params, on_device in parts:
                self._add_position(params, names, on_device, pin, (host_grads, grad_dtype))
            optimizer.param_groups[index]["params"] = self.masters[len(self.masters) - len(parts):]
        if self.param_files is not None:   # the shards to their file; placeholders stay (nvme_params.py)
            self.param_files.adopt([p for p in dict.fromkeys(module.parameters()) if P.is_partitioned(p)])
        cuda = ctx.dist_context.device.type == "cuda" and torch.cuda.is_available()
        self._copy_stream = torch.cuda.Stream(device=ctx.dist_context.device) if cuda and host_grads else None
        self.feed = self._start_feed(optimizer, pin) if self.device_grads else None
        if self.nvme is not None:
            optimizer.state_feed = self.nvme_feed = self.nvme.feed(self._copy_chunk)
        self.coordinator = ParamCoordinator(module, self.options)
        self.coordinator.install()
        if self.param_files is not None:
            self.coordinator.read_ahead = self.param_files.read_ahead
        self._overlap_helper = None
        self.spare_grads: list[torch.Tensor] = []   # overlap_step's second gradient buffers
        if self.offload_optimizer and zero.offload_optimizer.overlap_step:
            self._start_overlap(module, optimizer, pin)
        self._start_reductions()


    def _add_position(self, params, names, on_device: bool, pin: bool, grads: tuple[bool, torch.dtype]) -> None:
        """One flat master (a position) over ``params``, a part of one optimizer group: on the host
        with offload unless ``on_device`` (offload_optimizer.ratio keeps it on the device)."""
        ctx, (host_grads, grad_dtype) = self.context, grads
        device = ctx.dist_context.device if on_device else self.master_device
        whole = [not P.is_partitioned(p) for p in params]
        slots, total = plan_group([names[id(p)] for p in params], [tuple(P.full_shape(p)) for p in params],
                                  whole, ctx.dist_context.world_size, ctx.dist_context.rank)
        master = self._build_master(params, slots, total, pin and self.nvme is None, device)
        if self.nvme is not None:   # to the files; the optimizer steps a placeholder of its shape
            zero = ctx.config.zero_optimization
            master = self._master_to_files(master, self.optimizer, zero.offload_optimizer.nvme_path)
        self.group_slots.append(slots)
        self.group_params.append(params)
        self.masters.append(master)
        self.on_device.append(on_device and self.offload_optimizer)
        grad_device = device if host_grads else ctx.dist_context.device
        self.grads.append(host_buffer(total, grad_dtype, pin) if grad_device.type == "cpu" and pin
                          else torch.zeros(total, dtype=grad_dtype, device=grad_device))

    def _kept_on_device(self, zero, optimizer, trainable) -> list[int]:
        """Per optimizer group, how many leading parameters keep their optimizer states on the
        device (``offload_optimizer.ratio``, DeepSpeed's sub-group rule: partial_offload.py); 0
        each without offload or at ratio 1."""
        ratio = float(zero.offload_optimizer.ratio) if self.offload_optimizer else 1.0
        if ratio >= 1.0:
            return [0] * len(trainable)
        if not isinstance(optimizer, CPUAdam):   # as DeepSpeed's "Hybrid Optimizer Only Supports DeepSpeedCPUAdam"
            raise ConfigError(f"zero_optimization.offload_optimizer.ratio {ratio} needs the CPU Adam, not "
                              f"{type(optimizer).__name__}",
                              hint='use "optimizer": {"type": "AdamW"} (or Adam), which offload builds as the '
                                   "CPU Adam, or remove ratio")
        world = self.context.dist_context.world_size
        shares = [[share(P.full_numel(p), world) for p in params] for _, params in trainable]
        return device_params(shares, int(zero.sub_group_size), ratio)

    def _place_gradients(self, zero, optimizer) -> tuple[bool, torch.dtype]:
        """(whether the gradients live in host memory, their dtype); sets ``device_grads`` and ``grads_on_host``.

        With optimizer offload the gradients stay on the device until our CPU Adam takes them
        chunk by chunk (grad_feed.py), unless the step runs in the background (overlap_step keeps
        two host buffers) or a subclass measures the norm from the masters' .grad itself (tensor
        parallelism): then they go to a host buffer in the masters' dtype during backward. Offload
        with fp32 masters adds micro-steps up in fp32; one micro-step a step adds nothing up, and
        its gradients keep their dtype on the device. bf16 masters take bf16 gradients, added up
        in ``data_types.grad_accum_dtype`` (bf16 unless set), as DeepSpeed keeps them."""
        self.device_grads = bool(self.offload_optimizer and not zero.offload_optimizer.overlap_step
                                 and hasattr(optimizer, "grad_feed")
                                 and type(self).grad_square_sum is Stage3Strategy.grad_square_sum)
        host_grads = self.grads_on_host = self.offload_optimizer and not self.device_grads
        precision = self.context.precision
        accumulating = int(self.context.config.gradient_accumulation_steps) > 1
        fp32_sums = accumulating and torch.float32 in (precision.master_dtype, precision.grad_accum_dtype)
        if host_grads:
            return True, torch.float32 if fp32_sums else precision.master_dtype
        return False, torch.float32 if self.device_grads and fp32_sums else precision.grad_accum_dtype

    def _start_feed(self, optimizer, pin: bool):
        """device_grads: the optimizer takes each chunk's gradient from a GradFeed over self.grads."""
        feed = GradFeed(self.context.dist_context.device, optimizer.chunk_elements, pin,
                        dtype=self.context.precision.master_dtype)
        host = [position for position, on_device in enumerate(self.on_device) if not on_device]
        feed.use([self.masters[i] for i in host], [self.grads[i] for i in host])
        optimizer.grad_feed = feed
        # what a master's .grad holds meanwhile: the right shape, no memory (the feed has the values)
        self._grad_marks = [torch.zeros(1, dtype=m.dtype).expand(m.numel()) for m in self.masters]
        return feed

    def _start_overlap(self, module, optimizer, pin: bool) -> None:
        """overlap_step: a second host gradient buffer per group, and the per-parameter waits."""
        _prepare_of(optimizer)
        self.spare_grads = [host_buffer(g.numel(), g.dtype, pin) if g.device.type == "cpu" and pin
                            else torch.zeros_like(g) for g in self.grads]
        self._overlap_helper = Stage3StepOverlap(self, module, optimizer)
        self.overlap = self._overlap_helper.overlap

    def start_background_step(self, optimizer) -> None:
        """overlap_step: the prepared CPU Adam and the uploads in the worker thread; the gradients
        move to the other buffer at once, so the next backward may run beside the step."""
        update = optimizer.prepare_step()
        self.grads, self.spare_grads = self.spare_grads, self.grads
        self.zero_grad()
        self._overlap_helper.start(update)

    def _place_parameters(self, module, trainable) -> None:
        """Partition what is big enough, keep the rest whole; every rank starts from rank 0's values."""
        ctx = self.context
        every = list(dict.fromkeys(module.parameters()))
        numels = [P.full_numel(p) for p in every]
        whole = choose_persistent(numels, self.options.param_persistence_threshold,
                                  self.options.model_persistence_threshold)
        dtype = ctx.precision.param_dtype
        with torch.no_grad():
            for p, keep_whole in zip(every, whole):
                if P.is_partitioned(p):
                    self._adopt(p, keep_whole, dtype)
                    continue
                data = p.data.to(device=ctx.dist_context.device, dtype=dtype if p.is_floating_point() else p.dtype)
                if ctx.dist_context.world_size > 1:
                    broadcast_from(data, group=ctx.parallel.group("data"))
                p.data = data
                if keep_whole:
                    P.mark_persistent(p)
                else:
                    P.partition(p, ctx.parallel.group("data"), ctx.dist_context.rank, ctx.dist_context.world_size,
                                ctx.dist_context.device, shard_device=self.shard_device)
            for b in module.buffers():
                b.data = b.data.to(ctx.dist_context.device)
                if ctx.dist_context.world_size > 1:
                    broadcast_from(b.data, group=ctx.parallel.group("data"))

    def _adopt(self, p, keep_whole: bool, dtype) -> None:
        """A parameter partitioned by zero.Init: check its group, fix dtype and device, maybe make it whole."""
        ctx, state = self.context, p.ds_state
        if state.world_size != ctx.dist_context.world_size or state.rank != ctx.dist_context.rank:
            raise ConfigError(f"zero.Init partitioned a parameter over {state.world_size} ranks, "
                              f"the engine runs on {ctx.dist_context.world_size}",
                              hint="build the model under zero.Init with the engine's process group")
        state.device = ctx.dist_context.device
        if keep_whole:
            P.finish_gather(p)
            full = p.data.clone()
            del p.ds_state, p.ds_tensor, p.ds_shape, p.ds_numel, p.ds_status, p.ds_id
            p.data = full.to(dtype)
            P.mark_persistent(p)
            return
        if state.shard.dtype != dtype and state.shard.is_floating_point():
            state.shard = state.shard.to(dtype)
        state.shard = state.shard.to(self.shard_device)
        p.ds_tensor = state.shard
        p.data = P.empty_like_param(state.shard, state.device)

    def _build_master(self, params, slots, total: int, pin: bool, device: torch.device) -> torch.Tensor:
        """The position's flat master on ``device``; where the shards have its dtype and device they
        become views of it (no copy)."""
        master_dtype = self.context.precision.master_dtype
        if device.type == "cpu" and pin:
            master = host_buffer(total, master_dtype, pin)
        else:
            master = torch.zeros(total, dtype=master_dtype, device=device)
        position, nvme = len(self.masters), self.nvme
        with torch.no_grad():
            for p, slot in zip(params, slots):
                view = master[slot.offset:slot.offset + slot.length]
                source = p.data.reshape(-1) if slot.persistent else p.ds_state.shard
                view.copy_(source)
                if nvme is not None:   # the master goes to files: a changed parameter is written there
                    if slot.persistent:
                        p.ds_after_modify = lambda param, o=slot.offset: nvme.write_master(
                            position, o, param.data.reshape(-1))
                    else:
                        p.ds_state.on_update.append(lambda param, o=slot.offset: nvme.write_master(
                            position, o, P.shard_values(param.ds_state)))
                elif self.param_files is not None and not slot.persistent:   # the shard goes to a file
                    p.ds_state.on_update.append(lambda param, v=view: v.copy_(P.shard_values(param.ds_state)))
                elif source.dtype == master_dtype and source.device == master.device:
                    if slot.persistent:
                        p.data = view.view(slot.shape)
                    else:
                        p.ds_state.shard = p.ds_tensor = view
                elif not slot.persistent:
                    p.ds_state.on_update.append(lambda param, v=view: v.copy_(param.ds_state.shard))
                elif slot.persistent:
                    p.ds_after_modify = lambda param, v=view: v.copy_(param.data.reshape(-1))
        aliased = all((p.data if s.persistent else p.ds_state.shard).untyped_storage().data_ptr()
                      == master.untyped_storage().data_ptr() for p, s in zip(params, slots))
        self.aliased = self.aliased and aliased   # set True in setup, before the first group
        self.flat_params.append(None if aliased else self._flatten_params(params, slots, total))
        return master

    def _flatten_params(self, params, slots, total: int) -> torch.Tensor | None:
        """One model-dtype buffer laid out like the master, holding the group's shards and
        persistent parameters as views, so the step writes it back with one copy per range
        instead of one per parameter. None where the shards live elsewhere (offload_param)."""
        device = self.context.dist_context.device
        tensors = [p.data if slot.persistent else p.ds_state.shard for p, slot in zip(params, slots)]
        if not tensors or self.param_files is not None or any(
                t.device != device or t.dtype != tensors[0].dtype for t in tensors):
            return None
        flat = torch.empty(total, dtype=tensors[0].dtype, device=device)
        with torch.no_grad():
            for p, slot, tensor in zip(params, slots, tensors):
                view = flat[slot.offset:slot.offset + slot.length]
                view[:tensor.numel()].copy_(tensor.reshape(-1))
                if slot.persistent:
                    p.data = view.view(slot.shape)
                else:
                    p.ds_state.shard = p.ds_tensor = view
        return flat

    # ---- backward (the reductions: grad_reduce.py) ------------------------------------------
    def post_backward(self, is_boundary: bool) -> None:
        if self._leaf_slots:
            self._reduce_leaf_grads()
        self._finish_pending()
        self.coordinator.release_all()
        if is_boundary:
            self._reduce_persistent()

    # ---- the step -------------------------------------------------------------------------
    def prepare_master_grads(self, defer_cast: bool = False) -> None:
        if self.device_grads:   # the CPU Adam takes each host chunk of self.grads from the feed
            self.feed.arm()
            for master, mark, grad, on_device in zip(self.masters, self._grad_marks, self.grads, self.on_device):
                master.grad = grad.to(master.dtype) if on_device else mark
            return
        if self._copies_overwrite:
            if self._copy_stream is not None:
                self._copy_stream.synchronize()
            torch.cuda.current_stream().synchronize()   # the gradient copies to the host have landed
            for position, (grad, slots) in enumerate(zip(self.grads, self.group_slots)):
                for index, slot in enumerate(slots):   # a shard no gradient reached this step
                    if not slot.persistent and (position, index) not in self._touched:
                        grad[slot.offset:slot.offset + slot.length].zero_()
        self._uncast = []
        if (defer_cast and not self.before_norm and self.context.parallel.size("tensor") == 1
                and all(g.dtype != m.dtype and g.device == m.device for m, g in zip(self.masters, self.grads))):
            self._uncast = list(self.grads)   # cast_master_grads casts them, divided by the step's factor
            return
        for master, grad in zip(self.masters, self.grads):
            master.grad = grad if grad.dtype == master.dtype and grad.device == master.device \
                else grad.to(device=master.device, dtype=master.dtype)
        for call in self.before_norm:
            call()

    def cast_master_grads(self, scale: torch.Tensor | None) -> bool:
        uncast, self._uncast = self._uncast, []
        for master, grad in zip(self.masters, uncast):
            master.grad = cast_divided(grad, master.dtype, scale)
        return bool(uncast)

    def master_tensors(self) -> list[torch.Tensor]:
        return list(self.masters)

    def step_grads(self) -> list[torch.Tensor | None]:
        """Each group's gradient for this step: on the device with device_grads, else the master's .grad."""
        if self.device_grads or self._uncast:
            return list(self.grads)
        return [master.grad for master in self.masters]

    def data_square_sum(self) -> torch.Tensor:
        """Like the base, but a persistent parameter (whole on every rank) is counted once (square_sum.py)."""
        return square_sum(self)

    def whole_parameter_names(self) -> set[str]:
        """The persistent parameters: every data rank holds them whole."""
        return {slot.name for slots in self.group_slots for slot in slots if slot.persistent}

    def scale_master_grads(self, factor: float) -> None:
        if self.offload_optimizer and hasattr(self.optimizer, "grad_factor"):
            self.optimizer.grad_factor = factor   # applied as the CPU Adam reads each gradient
        else:
            super().scale_master_grads(factor)

    def after_optimizer_step(self) -> None:
        if self.nvme is not None and not self._nvme_resident:
            return   # each chunk went to the parameters as it was updated (_copy_chunk)
        for position, slots in enumerate(self.group_slots):
            self.copy_slots(position, 0, len(slots))

    def copy_slots(self, position: int, first: int, last: int) -> None:
        """Updated master -> slots [first, last) of group ``position`` (shards, persistent params)."""
        params, slots, master = self.group_params[position], self.group_slots[position], self.masters[position]
        flat = self.flat_params[position]
        if flat is not None:   # one range: from pinned host memory, asynchronous, cast on the device
            if first < last:
                low, high = slots[first].offset, slots[last - 1].offset + slots[last - 1].length
                with torch.no_grad():
                    copy_in_pieces(flat[low:high], master[low:high])
            return
        with torch.no_grad():
            for p, slot in zip(params[first:last], slots[first:last]):
                view = master[slot.offset:slot.offset + slot.length]
                if not slot.persistent and p.ds_state.swap is not None:   # offload_param nvme: to the file
                    p.ds_state.swap.write(p.ds_state, view)
                    continue
                target = p.data.view(-1) if slot.persistent else p.ds_state.shard
                if target.data_ptr() != view.data_ptr():
                    if view.device != target.device and view.dtype != target.dtype:
                        view = view.to(target.device, non_blocking=True)   # cast on the device
                    # from pinned host memory this is asynchronous: it overlaps the next forward,
                    # and the host masters are not written again before the next step's sync
                    target.copy_(view, non_blocking=True)

    @property
    def _copies_overwrite(self) -> bool:
        """Offload from a GPU: a shard's first gradient of a step is copied over the host buffer."""
        return self.offload_optimizer and not self.device_grads and self.context.dist_context.device.type == "cuda"

    def zero_grad(self) -> None:
        self._uncast = []
        self._touched.clear()
        self._device_squares, self._norm_on_device = 0.0, True
        for master, grad, slots, on_device in zip(self.masters, self.grads, self.group_slots, self.on_device):
            if self._copies_overwrite and not on_device:   # a shard's first copy overwrites: zero only what adds up
                pieces = [grad[slot.offset:slot.offset + slot.length] for slot in slots if slot.persistent]
                if pieces:
                    torch._foreach_zero_(pieces)
            else:
                grad.zero_()
            master.grad = None
        for params in self.group_params:
            for p in params:
                p.grad = None

    # ---- reporting ------------------------------------------------------------------------
    def destroy(self) -> None:
        """Remove every hook; the parameters stay partitioned (as DeepSpeed's destroy leaves them)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        self.coordinator.remove()
        if self._overlap_helper is not None:
            self._overlap_helper.remove()
        if self.nvme is not None:
            self.nvme_feed.close()
        if self.param_files is not None:
            self.param_files.close()

    def compile_units(self, blocks: list[torch.nn.Module], rest: bool = False) -> None:
        """``engine.compile()``: gather each block's parameters as one, around its compiled forward;
        ``rest``: and everything outside the blocks as one, around the module's compiled forward."""
        self.coordinator.use_units(blocks, rest=rest)

    def full_shapes(self) -> dict[str, tuple[int, ...]]:
        return self.param_shapes

    def release_gathered(self) -> None:
        """Free every gathered parameter (engine.empty_partition_cache)."""
        self.coordinator.release_all()

    def offloaded_numel(self) -> int:
        if not self.offload_optimizer or self.nvme is not None:
            return 0
        return sum(master.numel() for master, kept in zip(self.masters, self.on_device) if not kept)

    def memory_breakdown(self) -> dict[str, int]:
        def nbytes(t):
            return t.numel() * t.element_size()
        shards = sum(nbytes(p.ds_state.shard) for p in self.module.parameters()
                     if P.is_partitioned(p) and p.ds_state.swap is None)   # nvme: in the file, not here
        whole = sum(nbytes(p.data) for p in self.module.parameters() if not P.is_partitioned(p))
        masters = 0 if self.aliased or self.nvme is not None else sum(nbytes(m) for m in self.masters)
        parts = {"parameters": shards + whole, "gradients": sum(nbytes(g) for g in self.grads),
                 "master_weights": masters, "optimizer_states": self.optimizer_state_bytes()}
        if self.offload_optimizer:   # the gradients' host buffers: two with overlap_step, or the feed's slots
            host = [g for g in self.grads + self.spare_grads if g.device.type == "cpu"] if self.grads_on_host else []
            parts["gradients"] -= sum(nbytes(g) for g in self.grads if g.device.type == "cpu") \
                if self.grads_on_host else 0
            parts["host_gradients"] = sum(nbytes(g) for g in host + (self.feed.slots if self.feed else []))
        if self.nvme is not None:   # the states' host slots; the states themselves are on disk
            parts["nvme_buffers"] = self.nvme_feed.host_bytes()
        if self.param_files is not None:   # the parameters' staging buffers; the shards are on disk
            parts["nvme_param_buffers"] = self.param_files.host_bytes()
        return parts
