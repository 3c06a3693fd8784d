"""``deepspeed.utils.z3_leaf_module``: ZeRO-3 leaf modules (built in ``stages/stage3/leaf_modules.py``)."""
from launcher.zero.stages.stage3.leaf_modules import (  # noqa: F401
    get_z3_leaf_modules, set_z3_leaf_module, set_z3_leaf_modules, set_z3_leaf_modules_by_name,
    set_z3_leaf_modules_by_suffix, unset_z3_leaf_modules, z3_leaf_module, z3_leaf_parameter,
)
