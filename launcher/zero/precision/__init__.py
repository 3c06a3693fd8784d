"""Precision, shared by both engines and the strategies: which dtype each tensor role uses and the one
skip rule (policy.py); fp16 dynamic loss scaling (loss_scaler.py)."""
