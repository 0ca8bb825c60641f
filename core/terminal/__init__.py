"""Terminal text: plain-text tables and verdicts, and the views the app draws (heatmap, layers, tokens).
Imports the numbers; never torch at import."""
