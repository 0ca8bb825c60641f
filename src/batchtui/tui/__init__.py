"""batchtui's terminal app: a view over `core`, which it calls in thread workers."""
