"""The batch-invariant mode: row-invariant matmuls, reductions, element-wise ops and attention per row.
Imports the layers below it (models, numbers, compat) and the top level."""
