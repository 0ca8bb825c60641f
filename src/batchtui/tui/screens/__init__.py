"""The app's screens: the explorer (its panes laid out, the keys of every pane), help, prompts, remedies, sweep
and the rollouts view. They import the widgets, never the other way round."""
