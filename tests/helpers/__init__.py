"""What the tests share and are not tests: tiny checkpoints of many architectures, rollouts files, real servers, the
app's pilot helpers, an independent oracle. Imported as `helpers.NAME` (tests/ is on the path through conftest.py)."""
