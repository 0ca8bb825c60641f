"""The run: the backend interface, the runner's passes, the engine (`compare`), generation, the trainer's forward
and the first op (the experiments over it: `experiments/`). Imports models, numbers, the invariant mode."""
