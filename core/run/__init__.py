"""The run: the backend interface, the runner's passes, the engine (`compare`), generation, remedies, sweep,
probe, bench, kernel classes and the first op. Imports models, numbers, the invariant mode."""
