"""Model parallelism over one topology: the rank <-> (pipe, data, model) coordinate map and its groups."""
from launcher.zero.parallel.topology import (PipeDataParallelTopology, PipeModelDataParallelTopology,
                                             ProcessTopology)

__all__ = ["ProcessTopology", "PipeDataParallelTopology", "PipeModelDataParallelTopology"]
