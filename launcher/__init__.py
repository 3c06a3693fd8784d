"""dslaunch: a launcher for distributed PyTorch training, with a bundled ZeRO engine.

Importing this package must stay cheap and torch-free: the launcher path
(`dslaunch --help`, `--dry-run`) never imports torch. The engine lives in
`launcher.zero` and is imported only by training scripts.
"""

__version__ = "0.1.0"
