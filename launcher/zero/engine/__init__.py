"""The data-parallel engine: forward, backward and the step (zero_engine.py), the optimizer it hands out,
its observers (instruments, reporting, monitor), compile; ``assembly/`` builds it."""
