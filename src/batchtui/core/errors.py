"""Errors the engine raises on purpose; each carries a one-line message meant for the user."""


class BatchtuiError(Exception):
    """Base of every error batchtui reports to a user instead of a traceback."""


class InputError(BatchtuiError):
    """A text or a setting the user gave cannot be used (CLI exit code 2)."""


class ModelLoadError(BatchtuiError):
    """The model or its tokenizer could not be loaded or used (CLI exit code 2)."""


class ResourceError(BatchtuiError):
    """The device ran out of memory; the run was stopped and its memory released."""


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA raises OutOfMemoryError; the CPU allocator a plain RuntimeError ("can't allocate memory")."""
    message = str(exc)
    return type(exc).__name__ == "OutOfMemoryError" or "can't allocate memory" in message or "out of memory" in message


class Cancelled(BatchtuiError):
    """The caller abandoned a comparison through its `cancelled` hook."""


class NotInvariant(InputError):
    """The batch-invariant mode cannot make this model's rows independent of the batch (the message says
    what it does not cover)."""
