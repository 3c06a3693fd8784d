"""Block-sparse attention: DeepSpeed's sparsity layouts and a SparseSelfAttention module
(flex_attention block masks on CUDA, the same mask computed densely elsewhere)."""

from launcher.zero.sparse_attention.attention import SparseSelfAttention, dense_block_sparse_attention, expand_layout
from launcher.zero.sparse_attention.sparsity_config import (BigBirdSparsityConfig, BSLongformerSparsityConfig,
                                                           DenseSparsityConfig, FixedSparsityConfig,
                                                           LocalSlidingWindowSparsityConfig, SparsityConfig,
                                                           SparsityConfigError, VariableSparsityConfig)

__all__ = ["SparseSelfAttention", "SparsityConfig", "DenseSparsityConfig", "FixedSparsityConfig",
           "VariableSparsityConfig", "BigBirdSparsityConfig", "BSLongformerSparsityConfig",
           "LocalSlidingWindowSparsityConfig", "SparsityConfigError", "dense_block_sparse_attention", "expand_layout"]
