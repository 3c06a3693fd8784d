"""The data-parallel engine: forward, backward and the step (zero_engine.py), the optimizer it hands out,
its observers (watch, reporting, monitor), compile; ``assembly/`` builds it."""
