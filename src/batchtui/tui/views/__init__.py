"""The app's view-models: what each pane draws, worked out from core's results in plain Python (rows, ticks, the status
line's parts, the heatmap's cells and buckets, a generation's and a served run's screen). They import neither textual
nor torch (import-linter holds it), so that they are tested without an app and the widgets only draw them."""
