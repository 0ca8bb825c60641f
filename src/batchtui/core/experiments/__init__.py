"""Experiments over the engine: a grid of settings (`sweep`), one Linear layer (`probe`), remedies measured before and
after, which of the batch-invariant mode's kernel classes a difference comes from, and `bench` (with its phase
clock). Imports the run below it; the commands and the app call it."""
