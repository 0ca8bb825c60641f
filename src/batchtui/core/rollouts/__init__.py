"""Rollouts a sampler made, scored as a trainer does, at a dataset's scale: the file read streaming and checked, the
plan of batches, the scoring (one process or a torchrun's ranks), the records a resumed run goes on from, and every
token's δ kept on disk for percentiles and histograms. Imports the run, numbers, models and the invariant mode."""
