"""Served models: the OpenAI-compatible client and its bounded transport, the served run (ladder, checks,
vs local), its result, report and the app's view of it. Imports the run, numbers, reports and terminal text."""
