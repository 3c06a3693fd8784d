"""Engine checkpoints: save and load (save_load.py), the on-disk format (format.py), fp32 consolidation;
the pipeline engine's per-layer checkpoints (pipeline_save_load.py)."""
