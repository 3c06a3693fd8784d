"""``deepspeed.runtime.config``: DeepSpeed 0.19.8's optimizer-name constants (``LAMB_OPTIMIZER``, ...)
and ``DeepSpeedConfigError`` (this engine's ConfigError: ``except DeepSpeedConfigError`` catches its
config errors, and a script may raise it).

These are names a config may carry; which of them this engine builds is in docs/reference (optimizers).
"""
from launcher.zero.errors import ConfigError as DeepSpeedConfigError  # noqa: F401

ADAGRAD_OPTIMIZER = "adagrad"
ADAM_OPTIMIZER = "adam"
ADAMW_OPTIMIZER = "adamw"
LAMB_OPTIMIZER = "lamb"
MUADAM_OPTIMIZER = "muadam"
MUADAMW_OPTIMIZER = "muadamw"
MUSGD_OPTIMIZER = "musgd"
LION_OPTIMIZER = "lion"
MUON_OPTIMIZER = "muon"
DEEPSPEED_OPTIMIZERS = [ADAGRAD_OPTIMIZER, ADAM_OPTIMIZER, ADAMW_OPTIMIZER, LAMB_OPTIMIZER, MUADAM_OPTIMIZER,
                        MUADAMW_OPTIMIZER, MUSGD_OPTIMIZER, LION_OPTIMIZER, MUON_OPTIMIZER]
