"""Terminal text: what the CLI prints, plain-text tables and verdicts (the app reuses some of their words); the app's
own view-models (the heatmap's buckets, a generation's screen) live in tui/views/.
Imports the numbers; never torch at import."""
