"""The app's widgets: each pane (heatmap, detail, layers, top-k, summary, settings, status line, generation
view, texts editor) and the pieces they share; each draws a view-model from tui/views/ and imports no screen."""
