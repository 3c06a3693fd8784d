"""Found first on the path under ``dslaunch --as-deepspeed``: ``deepspeed`` becomes ``launcher.zero``."""
from launcher.zero.shim import install

install()
