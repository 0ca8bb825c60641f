"""The one door to the frameworks' internals and version differences: every private name of transformers, torch
and argparse that the engine reads goes through a module here (`transformers`, `torch`, `argparse`), so that a
framework's next release is met in one place. Nothing else in batchtui names them (tests/test_layout.py)."""
