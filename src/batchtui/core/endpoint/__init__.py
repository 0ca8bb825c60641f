"""Served models: the OpenAI-compatible client and its bounded transport, the served run (ladder, checks,
vs local), its result and report (the app's view of it: tui/views/served.py). Imports the run, numbers, reports
and terminal text."""
