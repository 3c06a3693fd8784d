"""Activation checkpointing (``deepspeed.checkpointing``): recompute in backward what forward saved."""
