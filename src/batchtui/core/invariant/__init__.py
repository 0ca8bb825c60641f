"""The batch-invariant mode: row-invariant matmuls, reductions, element-wise ops and attention per row.
Imports models (structure) and the top level."""
