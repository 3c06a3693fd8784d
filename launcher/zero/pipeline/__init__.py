"""The pipeline engine behind ``launcher.zero.pipe`` (DeepSpeed's ``deepspeed.pipe``)."""
