"""The pipeline engine behind ``launcher.zero.pipe`` (DeepSpeed's ``deepspeed.pipe``): the module, its
partition and schedules, stage links, the engine; ``assembly/initialize_pipeline.py`` builds it."""
