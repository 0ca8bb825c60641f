"""Reports: JSON out and in, repro packs, the environment, diffs of two runs, sessions.
Imports the numbers, models and terminal text; never the command line."""
