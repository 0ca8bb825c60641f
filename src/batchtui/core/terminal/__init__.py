"""Terminal text: plain-text tables and verdicts, and the views the CLI and the app both draw (the heatmap's
buckets, generation and rollouts text); the app's own view-models live beside it, in tui/views/.
Imports the numbers; never torch at import."""
