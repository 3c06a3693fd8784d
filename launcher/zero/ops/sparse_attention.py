"""``deepspeed.ops.sparse_attention``: block-sparse attention with DeepSpeed's sparsity layouts."""
from launcher.zero.sparse_attention import (  # noqa: F401
    BigBirdSparsityConfig, BSLongformerSparsityConfig, DenseSparsityConfig, FixedSparsityConfig,
    LocalSlidingWindowSparsityConfig, SparseSelfAttention, SparsityConfig, SparsityConfigError,
    VariableSparsityConfig,
)
