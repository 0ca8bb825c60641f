"""Numbers: the metrics, top-k, logit rows, the result types (`Comparison`), CPU memory.
Imports only the top level."""
