"""A DeepSpeed 0.19.8 checkpoint read as this engine's own (format.py): the switch of a running
DeepSpeed job onto this engine, at the same or another world size and stage.

``DeepSpeedCheckpoint(tag_folder)`` gives what load_checkpoint reads from its own folders: the
metadata (parameters, and which saved rank holds which pieces of them), the model states (module,
scheduler, loss scale, counters, DeepSpeed's client state) and each saved rank's shard (fp32
masters and optimizer state, as fragments). Each rank of the new job then reads only the saved
ranks whose pieces it needs, as with this engine's checkpoints. What DeepSpeed does not save is
absent: RNG states, the micro-step count (the loader recomputes it from the step), a data position.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict

import torch

from launcher.zero.checkpoint import deepspeed_layout as layout
from launcher.zero.checkpoint.format import ranks_overlapping
from launcher.zero.checkpoint.deepspeed_layout import DeepSpeedCheckpointError

FORMAT_VERSION = 1
# the model-states keys DeepSpeed's load_checkpoint keeps to itself; the rest is the client state it returns
DEEPSPEED_STATES = ("module", "skipped_steps", "global_steps", "dp_world_size", "mp_world_size", "data_sampler",
                    "random_ltd", "lr_scheduler", "optimizer")
# optimizer group keys that describe the machine DeepSpeed ran on, not the run
DEVICE_GROUP_KEYS = ("params", "fused", "foreach", "capturable", "differentiable")


class DeepSpeedCheckpoint:
    """One DeepSpeed tag folder. ``group_names``: the trainable parameters' names in each optimizer
    param group, in order; needed at stage 0 only (DeepSpeed saves no names there), where it
    defaults to the module's parameters as one group."""

    def __init__(self, path: str, group_names: list[list[str]] | None = None):
        self.path = path
        self.stage3 = os.path.isfile(os.path.join(path, layout.zero_model_states_name(0))) or (
            not os.path.isfile(os.path.join(path, layout.MODEL_STATES)) and _has_stage3_model_states(path))
        name = layout.zero_model_states_name(0) if self.stage3 else layout.MODEL_STATES
        self.states_file = os.path.join(path, name)
        self.states = layout.load(self.states_file, "DeepSpeed's model states")
        config = self.states.get("ds_config") or {}
        dtype = self._param_dtype()
        self.bf16, self.fp16 = dtype == torch.bfloat16, dtype == torch.float16
        self.world_size = int(self._required(self.states, "dp_world_size", self.states_file))
        self._optim_cache: dict[int, tuple[str, dict]] = {}
        self._check_supported()
        self.stage = self._stage(config)
        self._check_files()
        self.groups = self._group_shapes(group_names)
        self.pieces = self._pieces(config)
        self._full_params: dict | None = None

    # ---- what load_checkpoint reads ---------------------------------------------------------------
    def metadata(self) -> dict:
        """This engine's metadata.json for the folder (format.py)."""
        params = [{"name": n, "shape": list(s), "numel": _numel(s)} for group in self.groups for n, s in group]
        frozen = list((self.states.get("frozen_param_shapes") or {}).keys())
        dtype = torch.bfloat16 if self.bf16 else torch.float16 if self.fp16 else torch.float32
        return {"format": FORMAT_VERSION, "world_size": self.world_size, "stage": self.stage,
                "param_dtype": str(dtype), "global_steps": self.states.get("global_steps", 0), "params": params,
                "shared_params": dict(self.states.get("shared_params") or {}), "frozen_params": frozen,
                "ranks": [[[p.name, p.param_start, p.numel] for p in pieces] for pieces in self.pieces],
                "deepspeed": {"version": self.states.get("ds_version"), "path": self.path}}

    def model_states(self) -> dict:
        """This engine's model_states.pt for the folder; ``client_state`` is what DeepSpeed's
        load_checkpoint returns (every model-states key it does not keep to itself)."""
        states = self.states
        return {"module": self._module_state_dict(), "param_groups": self._param_groups(),
                "lr_scheduler": states.get("lr_scheduler"), "loss_scaler": self._loss_scaler(),
                "global_steps": self._required(states, "global_steps", self.states_file),
                "global_samples": states.get("global_samples"), "skipped_steps": states.get("skipped_steps", 0),
                "micro_steps": None, "data_position": None, "ds_config": states.get("ds_config"),
                "client_state": {k: v for k, v in states.items() if k not in DEEPSPEED_STATES}}

    def model_states_for(self, param_groups: list[dict], accumulation_steps: int, train_batch_size: int,
                         scaler_state: dict | None = None) -> dict:
        """model_states() fitted to the engine that loads them: each group's hyper-parameters only
        where its optimizer has the key (FusedAdam's ``bias_correction`` and ``step`` stay out), the
        micro-step count DeepSpeed does not keep (a checkpoint is on a boundary), and the fp16 scaler
        state completed from the engine's own (DeepSpeed's stage 0 keeps no hysteresis)."""
        states = self.model_states()
        states["param_groups"] = [{key: value for key, value in saved.items() if key in group}
                                  for group, saved in zip(param_groups, states["param_groups"])]
        states["micro_steps"] = states["global_steps"] * accumulation_steps
        if states["global_samples"] is None:   # DeepSpeed before 0.9 kept none
            states["global_samples"] = states["global_steps"] * train_batch_size
        if scaler_state is not None and states["loss_scaler"] is not None:
            states["loss_scaler"]["state"] = {**scaler_state, **states["loss_scaler"]["state"]}
        return states

    def shard(self, rank: int) -> dict:
        """Saved rank ``rank``'s fragments in this engine's shard format (no RNG: DeepSpeed saves none)."""
        flat, flat_states, scalars = self._rank_flats(rank)
        fragments = []
        for piece in self.pieces[rank]:
            cut = slice(piece.offset, piece.offset + piece.numel)
            values = flat[piece.group] if isinstance(flat, list) else flat
            states = flat_states[piece.group] if isinstance(flat_states, list) else flat_states
            self._check_length(values, piece, rank)
            fragments.append({"name": piece.name, "group": piece.group, "param_start": piece.param_start,
                              "numel": piece.numel, "fp32": values[cut].float().clone(),
                              "state": {key: value.view(-1)[cut].clone() for key, value in states.items()},
                              "scalars": dict(scalars[piece.group] if isinstance(scalars, list) else scalars)})
        return {"format": FORMAT_VERSION, "rank": rank, "fragments": fragments}

    def full_fp32_params(self) -> dict[str, torch.Tensor]:
        """Every trainable parameter whole, in fp32 (what zero_to_fp32.py rebuilds)."""
        if self._full_params is None:
            full = {n: torch.zeros(_numel(s)) for group in self.groups for n, s in group}
            for rank in range(len(self.pieces)):
                for record in self.shard(rank)["fragments"]:
                    full[record["name"]][record["param_start"]:record["param_start"] + record["numel"]] = record["fp32"]
            self._full_params = {n: full[n].view(tuple(s)) for group in self.groups for n, s in group}
        return self._full_params

    # ---- layout -------------------------------------------------------------------------------------
    def _param_dtype(self) -> torch.dtype:
        """The training precision: the dtype DeepSpeed kept the module's parameters in (stage 3's
        placeholders keep it too)."""
        module = self._required(self.states, "module", self.states_file)
        buffers = set(self.states.get("buffer_names") or ())
        dtypes = [value.dtype for key, value in module.items()
                  if key not in buffers and torch.is_tensor(value) and value.is_floating_point()]
        return dtypes[0] if dtypes else torch.float32

    def _stage(self, config: dict) -> int:
        """The ZeRO stage from the files: stage 3 has per-rank model states, stage 0 no parameter
        shapes; else the zero_stage in rank 0's optimizer states (absent from what DeepSpeed's bf16
        optimizer writes at stage 1: the config's stage then)."""
        if self.stage3:
            return 3
        if self.states.get("param_shapes") is None:
            return 0
        path, saved = self._optim_states(0)
        stage = layout.plain(saved.get("zero_stage", (config.get("zero_optimization") or {}).get("stage", 1)))
        if stage not in (1, 2):
            raise DeepSpeedCheckpointError(f"{path}: zero_stage {stage!r} with stage 1/2 files",
                                           hint="the file is not one DeepSpeed 0.19.8 wrote, or it is damaged")
        return int(stage)

    def _check_files(self) -> None:
        """Every rank's files are there, checked before anything is read: each rank of the new job
        reads only some of them, and all must fail alike rather than some wait for the others."""
        wanted = [self._optim_file(rank) for rank in range(self.world_size)] if self.stage > 0 else []
        if self.stage3:
            wanted += [os.path.join(self.path, layout.zero_model_states_name(r)) for r in range(self.world_size)]
        missing = [name for name in wanted if not os.path.isfile(name)]
        if missing:
            raise DeepSpeedCheckpointError(
                f"{missing[0]}: missing ({len(missing)} of the {self.world_size} ranks' files of {self.path} missing)",
                hint="the DeepSpeed checkpoint is incomplete: copy every file of the tag folder")

    def _check_supported(self) -> None:
        unsupported = []
        if self.states.get("mp_world_size", 1) != 1:
            unsupported.append(f"tensor parallelism (mp_world_size {self.states['mp_world_size']})")
        if (self.states.get("checkpoint_parallel_dimensions") or {}).get("pp_degree", 1) != 1:
            unsupported.append("pipeline parallelism")
        if "num_experts" in self.states:
            unsupported.append("Mixture of Experts")
        if os.path.isdir(os.path.join(self.path, "offloaded_tensors")):
            unsupported.append("optimizer states offloaded to NVMe (offloaded_tensors/)")
        if os.path.isdir(os.path.join(self.path, "zero")):
            unsupported.append("the universal layout (zero/)")
        if unsupported:
            raise DeepSpeedCheckpointError(
                f"{self.states_file}: a DeepSpeed checkpoint with {', '.join(unsupported)} cannot be continued here",
                hint="convert it with DeepSpeed's zero_to_fp32.py and load the weights into the model "
                     "(the optimizer state starts afresh)")

    def _group_shapes(self, group_names) -> list[list[tuple[str, tuple]]]:
        """Each param group's trainable ``(name, shape)`` in DeepSpeed's flattening order."""
        if self.stage > 0:
            shapes = self._required(self.states, "param_shapes", self.states_file)
            return [[(name, tuple(shape)) for name, shape in group.items()] for group in shapes]
        module = self._required(self.states, "module", self.states_file)
        if group_names is None:
            buffers = set(self.states.get("buffer_names") or ())
            group_names = [[name for name in module if name not in buffers]]
        missing = [name for names in group_names for name in names if name not in module]
        if missing:
            raise DeepSpeedCheckpointError(f"{self.states_file}: module state has no parameter '{missing[0]}'",
                                           hint="load a checkpoint of the same model")
        return [[(name, tuple(module[name].shape)) for name in names] for names in group_names]

    def _pieces(self, config: dict) -> list[list[layout.Piece]]:
        if self.stage == 0:     # one saved "rank": rank 0's model states hold every parameter whole
            pieces = []
            for group, params in enumerate(self.groups):
                offset = 0
                for name, shape in params:
                    pieces.append(layout.Piece(name, group, 0, _numel(shape), offset))
                    offset += _numel(shape)
            return [pieces]
        if self.stage == 3:
            params = [(n, g, _numel(s)) for g, group in enumerate(self.groups) for n, s in group]
            return layout.stage3_pieces(params, self.world_size)
        per_rank: list[list[layout.Piece]] = [[] for _ in range(self.world_size)]
        aligned = bool((config.get("zero_optimization") or {}).get("parameter_alignment", False))
        for group, params in enumerate(self.groups):
            numels = [(name, _numel(shape)) for name, shape in params]
            ranks, _ = layout.stage12_pieces(numels, group, self.world_size,
                                             _alignment_paddings(numels, 2 if (self.bf16 or self.fp16) else 4)
                                             if aligned else None)
            for rank, pieces in enumerate(ranks):
                per_rank[rank].extend(pieces)
        return per_rank

    # ---- one saved rank's flat tensors ----------------------------------------------------------------
    def _rank_flats(self, rank: int):
        """(fp32 flat partitions, flat optimizer-state tensors, scalar state), each per param group
        (a list) or for all groups together (stage 3: one flat a rank, in param_shapes order)."""
        if self.stage == 0:
            return self._stage0_flats()
        name, saved = self._optim_states(rank)
        if self.stage == 3:
            flat = torch.cat([t.view(-1) for t in self._required(saved, "fp32_flat_groups", name)])
            inner = self._required(saved, "optimizer_state_dict", name)
            ids = [i for group in inner["param_groups"] for i in group["params"]]
            states, scalars = _split_state([inner["state"].get(i, {}) for i in ids])
            return flat, states, scalars
        partitions = self._required(saved, "single_partition_of_fp32_groups", name)
        base = self._required(saved, "base_optimizer_state", name)
        if isinstance(base, dict):   # rigid (DeepSpeed's default): the torch optimizer's own state dict
            per_group = [base["state"].get(group["params"][0], {}) for group in base["param_groups"]]
        else:                        # elastic_checkpoint: one lean state a group, the step beside it
            per_group = [dict(state, step=saved.get("base_optimizer_state_step", 0)) for state in base]
        _refuse_muon_momentum(per_group, partitions, name)
        split = [_split_state([state]) for state in per_group]
        return list(partitions), [s for s, _ in split], [c for _, c in split]

    def _stage0_flats(self):
        optimizer = self.states.get("optimizer")
        if optimizer is None:
            raise DeepSpeedCheckpointError(f"{self.states_file}: no optimizer state (key 'optimizer' is None)",
                                           hint="load it with load_optimizer_states=False to take the weights only")
        if "fp32_groups_flat" in optimizer:   # fp16/bf16 without ZeRO: FP16_Optimizer over flat groups
            inner = optimizer["optimizer_state_dict"]
            per_group = [inner["state"].get(group["params"][0], {}) for group in inner["param_groups"]]
            split = [_split_state([state]) for state in per_group]
            return list(optimizer["fp32_groups_flat"]), [s for s, _ in split], [c for _, c in split]
        module = self.states["module"]      # fp32 without ZeRO: the torch optimizer over the parameters
        flats, states, scalars = [], [], []
        for names, group in zip(self.groups, optimizer["param_groups"]):
            flats.append(torch.cat([module[name].float().view(-1) for name, _ in names]))
            state, scalar = _split_state([optimizer["state"].get(i, {}) for i in group["params"]])
            states.append(state)
            scalars.append(scalar)
        return flats, states, scalars

    def _optim_states(self, rank: int) -> tuple[str, dict]:
        """Rank ``rank``'s optimizer_state_dict and its file (rank 0's is kept: the model states read it too)."""
        if rank in self._optim_cache:
            return self._optim_cache[rank]
        name = self._optim_file(rank)
        found = name, self._required(layout.load(name, f"rank {rank}'s optimizer states"), "optimizer_state_dict", name)
        if rank == 0:
            self._optim_cache[0] = found
        return found

    def _optim_file(self, rank: int) -> str:
        for bf16 in (self.bf16, not self.bf16):   # DeepSpeed's own order: this precision's name first
            path = os.path.join(self.path, layout.optim_states_name(rank, bf16))
            if os.path.isfile(path):
                return path
        return os.path.join(self.path, layout.optim_states_name(rank, self.bf16))   # load() names it missing

    def _check_length(self, values: torch.Tensor, piece: layout.Piece, rank: int) -> None:
        if piece.offset + piece.numel > values.numel():
            raise DeepSpeedCheckpointError(
                f"{self.path}: rank {rank}'s partition has {values.numel()} elements, '{piece.name}' needs "
                f"{piece.offset + piece.numel}", hint="the files of this tag come from different runs or world sizes")

    # ---- model states -----------------------------------------------------------------------------
    def _module_state_dict(self) -> dict:
        """The module's state dict: at stage 3 DeepSpeed saves placeholders for the parameters, so
        they are rebuilt from the fp32 masters (and the frozen ones from every rank's fragments)."""
        module = dict(self._required(self.states, "module", self.states_file))
        if not self.stage3:
            return module
        dtype = torch.bfloat16 if self.bf16 else torch.float16 if self.fp16 else torch.float32
        module.update({name: value.to(dtype) for name, value in self.full_fp32_params().items()})
        module.update(self._stage3_frozen_params())
        return module

    def _stage3_frozen_params(self) -> dict:
        shapes = self.states.get("frozen_param_shapes") or {}
        if not shapes:
            return {}
        parts = {name: [] for name in shapes}
        for rank in range(self.world_size):
            path = os.path.join(self.path, layout.zero_model_states_name(rank))
            fragments = layout.load(path, f"rank {rank}'s model states").get("frozen_param_fragments") or {}
            for name in shapes:
                parts[name].append(self._required(fragments, name, path).view(-1))
        return {name: torch.cat(parts[name])[:_numel(shape)].view(tuple(shape)) for name, shape in shapes.items()}

    def _param_groups(self) -> list[dict]:
        groups = self._base_param_groups()
        return [{k: v for k, v in group.items() if k not in DEVICE_GROUP_KEYS} for group in groups]

    def _base_param_groups(self) -> list[dict]:
        if self.stage == 0:
            optimizer = self.states.get("optimizer") or {}
            return (optimizer.get("optimizer_state_dict") or optimizer).get("param_groups", [])
        _, saved = self._optim_states(0)
        inner = saved.get("optimizer_state_dict") if self.stage == 3 else saved.get("base_optimizer_state")
        if isinstance(inner, dict):
            return inner.get("param_groups", [])
        return []   # elastic stage 1/2 checkpoints keep no param groups: the config's stay

    def _loss_scaler(self) -> dict | None:
        """The fp16 loss scale in this engine's form (loss_scaler.py's ScalerState); None otherwise."""
        if not self.fp16:
            return None
        if self.stage == 0:
            saved = self.states.get("optimizer") or {}
            fields = {"cur_scale": saved.get("cur_scale"), "cur_iter": saved.get("cur_iter", 0),
                      "last_overflow_iter": saved.get("last_overflow_iter", -1)}
        else:
            path, saved = self._optim_states(0)
            fields = vars(self._required(saved, "loss_scaler", path))
        state = {"scale": float(fields["cur_scale"]), "iteration": int(fields.get("cur_iter", 0)),
                 "last_overflow_iteration": int(fields.get("last_overflow_iter", -1))}
        if fields.get("cur_hysteresis") is not None:
            state["hysteresis_left"] = int(fields["cur_hysteresis"])
        return {"state": state}

    @staticmethod
    def _required(mapping: dict, key: str, path: str):
        if not isinstance(mapping, dict) or key not in mapping:
            raise DeepSpeedCheckpointError(f"{path}: key '{key}' is missing",
                                           hint="the file is not one DeepSpeed 0.19.8 wrote, or it is damaged")
        return mapping[key]


def _refuse_muon_momentum(per_group: list[dict], partitions, name: str) -> None:
    """DeepSpeed's Muon at ZeRO 1-2 keeps one flat momentum over the whole matrices a rank touches, not
    over its partition: cut like Adam's moments it would land on the wrong elements, so it is refused."""
    for index, (state, partition) in enumerate(zip(per_group, partitions)):
        momentum = state.get("momentum_buffer")
        if torch.is_tensor(momentum) and momentum.numel() != partition.numel():
            raise DeepSpeedCheckpointError(
                f"{name}: param group {index} holds DeepSpeed's Muon momentum ({momentum.numel()} elements over the "
                f"matrices the rank touches, its partition has {partition.numel()}), which this engine cannot place",
                hint="convert it with DeepSpeed's zero_to_fp32.py and load the weights into the model "
                     "(Muon's momentum starts afresh)")


def _split_state(states: list[dict]) -> tuple[dict, dict]:
    """Per-parameter optimizer states concatenated into flat tensors, and the scalar ones. The step
    becomes a float tensor, as torch's optimizers keep it; DeepSpeed's FusedAdam counts it on the
    group's last parameter only and steps every parameter with that count, hence the largest."""
    flats, scalars = {}, {}
    for key in states[0] if states else ():
        values = [state[key] for state in states]
        if torch.is_tensor(values[0]) and values[0].dim() > 0:
            flats[key] = torch.cat([value.reshape(-1) for value in values])
        elif key == "step":
            scalars[key] = torch.tensor(max(float(value) for value in values))
        else:
            scalars[key] = values[0]
    return flats, scalars


def _alignment_paddings(numels: list[tuple[str, int]], element_size: int) -> list[int]:
    """zero_optimization.parameter_alignment's padding after each parameter (stage_1_and_2.py)."""
    alignment = 16 // math.gcd(16, element_size)
    paddings, offset = [], 0
    for index, (_, numel) in enumerate(numels):
        offset += numel
        padding = 0 if index == len(numels) - 1 else (-offset) % alignment
        paddings.append(padding)
        offset += padding
    return paddings


def read_deepspeed(engine, path: str, fragments: list, all_gather) -> tuple[dict, dict, dict]:
    """What ``engine.load_checkpoint`` restores from a DeepSpeed tag folder: this engine's metadata,
    model states fitted to the engine, and the shards of the saved ranks holding ``fragments``
    (this rank's). Collective: ``all_gather`` (every rank's value, in rank order) tells each rank
    every optimizer group's parameter names, which DeepSpeed does not save at stage 0."""
    listing = all_gather([[f.name, f.group] for f in fragments])
    source = DeepSpeedCheckpoint(path, group_names=group_names(entry for ranks in listing for entry in ranks))
    scaler = engine.loss_scaler
    states = source.model_states_for(engine.basic_optimizer.param_groups, engine.gradient_accumulation_steps(),
                                     engine.train_batch_size(), asdict(scaler.state) if scaler is not None else None)
    metadata = source.metadata()
    wanted: dict[str, list] = {}
    for fragment in fragments:
        wanted.setdefault(fragment.name, []).append((fragment.param_start, fragment.param_start + fragment.numel))
    return metadata, states, {rank: source.shard(rank) for rank in ranks_overlapping(metadata, wanted)}


def group_names(entries) -> list[list[str]]:
    """Each optimizer group's parameter names in order, from ``(name, group)`` pairs listed rank
    after rank in flat order (every rank's fragments: a name may repeat, its first place counts)."""
    names: dict[int, list[str]] = {}
    for name, group in entries:
        if name not in names.setdefault(group, []):
            names[group].append(name)
    return [names[group] for group in sorted(names)]


def _has_stage3_model_states(path: str) -> bool:
    return os.path.isdir(path) and any(n.startswith("zero_pp_rank_") and n.endswith("_model_states.pt")
                                       for n in os.listdir(path))


def _numel(shape) -> int:
    count = 1
    for dim in shape:
        count *= int(dim)
    return count


def is_deepspeed_checkpoint(path: str) -> bool:
    """True for a tag folder DeepSpeed wrote (and not this engine)."""
    return layout.is_deepspeed_tag(path) and not os.path.isfile(os.path.join(path, "metadata.json"))
