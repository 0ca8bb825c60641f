"""Models: loading, the built-ins, sources and hub look-ups, transformers compatibility, the model's structure.
Imports only the top level (settings, errors)."""
