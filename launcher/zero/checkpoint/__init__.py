"""Engine checkpoints: save and load (save_load.py), the on-disk format (format.py), fp32 consolidation."""
