"""What a comparison runs with: plain, torch-free settings and their validation."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from .errors import InputError

DTYPES = ("auto", "float32", "bfloat16", "float16", "float64")
PADDING_SIDES = ("left", "right")
POSITION_MODES = ("mask", "arange")
DEFAULT_MODEL = "tiny"
# The seed's torch.allclose tolerances.
DEFAULT_ATOL = 1e-5
DEFAULT_RTOL = 1e-3


@dataclass(frozen=True)
class Settings:
    """Everything that decides the numbers of one comparison."""

    model: str = DEFAULT_MODEL
    dtype: str = "auto"
    device: str = "auto"
    device_map: str | None = None  # e.g. "auto": shard across the host's GPUs with accelerate
    batch_size: int = 8
    padding_side: str = "left"
    positions: str = "mask"
    attn: str | None = None
    top_k: int = 5
    max_tokens: int | None = None  # cut longer texts (flagged `truncated`); None: the model's context
    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    trust_remote_code: bool = False
    # Extra measurements, each costing passes or memory: off unless asked for.
    modules: bool = False  # per-module hidden states (norms, attention, MLP, residual) per layer
    decompose: bool = False  # also run each padded row alone: batch-size vs padding effect
    reference: bool = False  # also run each text alone in float64 on the CPU

    def validated(self) -> Settings:
        """Return self, or raise InputError naming the first unusable setting."""
        if not self.model.strip():
            raise InputError("model must not be empty")
        if self.dtype not in DTYPES:
            raise InputError(f"dtype must be one of {', '.join(DTYPES)}, not {self.dtype!r}")
        if self.padding_side not in PADDING_SIDES:
            raise InputError(f"padding side must be left or right, not {self.padding_side!r}")
        if self.positions not in POSITION_MODES:
            raise InputError(f"positions must be mask or arange, not {self.positions!r}")
        if self.batch_size < 1:
            raise InputError(f"batch size must be at least 1, not {self.batch_size}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise InputError(f"max tokens must be at least 1, not {self.max_tokens}")
        if self.top_k < 1:
            raise InputError(f"top-k must be at least 1, not {self.top_k}")
        if self.atol < 0 or self.rtol < 0:
            raise InputError(f"atol and rtol must not be negative (atol={self.atol}, rtol={self.rtol})")
        return self

    def with_changes(self, **changes) -> Settings:
        return replace(self, **changes)

    def as_dict(self) -> dict:
        return asdict(self)
