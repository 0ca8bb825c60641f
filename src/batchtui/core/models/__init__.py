"""Models: loading, the built-ins, sources and hub look-ups, the model's structure.
Imports the layer below it that it needs (compat: transformers' and torch's one door) and the top level."""
