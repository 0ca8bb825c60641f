"""batchtui: why an LLM's logits for a text differ between a batched and a single run.

`batchtui.core` is the engine (torch and transformers, no UI toolkit); `batchtui.tui` the terminal app over it.
"""
