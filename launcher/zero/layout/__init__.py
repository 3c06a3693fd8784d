"""Pure layout math: flat per-group buffers (flat.py) and how a flat range splits over ranks (partition_math.py)."""
