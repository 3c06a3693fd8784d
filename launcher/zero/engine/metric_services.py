"""Weights & Biases and Comet: the monitor's metrics sent through the services' own packages (rank 0).

Each writer takes the same ``(step, {name: value})`` events as the CSV and TensorBoard files
(DeepSpeed's names, ``Train/Samples/train_loss``; the step is the global sample count, as
DeepSpeed's). A package that is not installed, or a service that fails to start or to take a
write, costs one warning and training goes on without it (monitor.py drops a failing writer).
"""
from __future__ import annotations

import atexit


class WandbWriter:
    """``wandb.init(project, group, entity=team, name=job_name)``; ``WANDB_MODE=offline`` works as wandb says."""

    def __init__(self, section, wandb_module):
        self.wandb = wandb_module
        self.run = wandb_module.init(project=section.project, group=section.group, entity=section.team,
                                     name=section.job_name)
        atexit.register(self.close)

    def write(self, step: int, values: dict[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


class CometWriter:
    """``comet_ml.start(...)`` with the section's keys; ``online: false`` writes an offline archive."""

    def __init__(self, section, comet_module):
        self.experiment = comet_module.start(api_key=section.api_key, project=section.project,
                                             workspace=section.workspace, experiment_key=section.experiment_key,
                                             mode=section.mode, online=section.online)
        if section.experiment_name is not None:
            self.experiment.set_name(section.experiment_name)
        self.interval = section.samples_log_interval
        self._last: dict[str, int] = {}
        atexit.register(self.close)

    def write(self, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            last = self._last.get(name)
            if last is None or step - last >= self.interval:   # DeepSpeed's samples_log_interval rule
                self._last[name] = step
                self.experiment.log_metric(name, value, step=step)

    def close(self) -> None:
        if self.experiment is not None:
            self.experiment.end()
            self.experiment = None


def open_services(config, warn) -> list:
    """The writers the config enables (call on rank 0 only); ``warn(text)`` for a missing package."""
    writers = []
    for key, package, writer in (("wandb", "wandb", WandbWriter), ("comet", "comet_ml", CometWriter)):
        section = getattr(config, key)
        if not section.enabled:
            continue
        try:
            module = __import__(package)
        except ImportError:
            warn(f"{key}.enabled is set but the {package} package is not installed; pip install {package} "
                 "(continuing without it)")
            continue
        try:
            writers.append(writer(section, module))
        except Exception as error:   # a service that cannot start (no network, no key) is the watcher's problem
            warn(f"{key}: could not start ({type(error).__name__}: {error}); training goes on without it")
    return writers
