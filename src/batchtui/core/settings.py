"""What a comparison runs with: plain, torch-free settings and their validation."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace

from .errors import InputError

# The one table of dtypes. Every floating type a run or a probed Linear layer computes in, by precision; a run
# may also ask for "auto" (the checkpoint's own), and the app cycles through them in this order.
FLOAT_DTYPES = ("bfloat16", "float16", "float32", "float64")
DTYPES = ("auto", *FLOAT_DTYPES)
LOW_PRECISION_GRID = ("bfloat16", "float16", "float32")  # probe's and the app's sweep's default dtypes
SHORT_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64"}
PADDING_SIDES = ("left", "right")
POSITION_MODES = ("mask", "arange")
# The batch-invariant mode's four parts (`invariant`): each makes one kind of kernel independent of the batch.
KERNEL_CLASSES = ("matmul", "reduction", "attention", "elementwise")
DEFAULT_MODEL = "qwen2-english-4m"  # trained, English; `tiny` (random) is the fast one for tests
# The seed's torch.allclose tolerances.
DEFAULT_ATOL = 1e-5
DEFAULT_RTOL = 1e-3


# What a field says of itself beyond its type and default (`field(metadata=...)`): `restored` False where a session
# never brings it back (the machine's own and the user's trust come from each command line); `dest` where its
# command-line option's destination has another name.
NOT_RESTORED = {"restored": False}


@dataclass(frozen=True)
class Settings:
    """Everything that decides the numbers of one comparison."""

    model: str = DEFAULT_MODEL
    dtype: str = "auto"
    device: str = field(default="auto", metadata=NOT_RESTORED)
    device_map: str | None = field(default=None, metadata=NOT_RESTORED)  # "auto": shard across the host's GPUs
    batch_size: int = 8
    padding_side: str = "left"
    positions: str = "mask"
    attn: str | None = None
    top_k: int = 5
    max_tokens: int | None = field(default=None, metadata=NOT_RESTORED)  # cut longer texts; None: the context
    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    trust_remote_code: bool = field(default=False, metadata=NOT_RESTORED)
    # Extra measurements, each costing passes or memory: off unless asked for.
    modules: bool = field(default=False, metadata={"dest": "layers"})  # per-module hidden states, per layer
    decompose: bool = False  # also run each padded row alone: batch-size vs padding effect
    reference: bool = False  # also run each text alone in float64 on the CPU
    invariant: bool = False  # run every pass in the batch-invariant mode (`batch_invariant`)
    # with `invariant`: its parts, comma-separated (KERNEL_CLASSES); "": all four
    invariant_classes: str = field(default="", metadata=NOT_RESTORED)

    def validated(self) -> Settings:
        """Return self, or raise InputError naming the first unusable setting (a session file or a
        caller may hand over values of any type, so types are checked too)."""
        _check_types(self)
        if not self.model.strip():
            raise InputError("model must not be empty")
        if self.dtype not in DTYPES:
            raise InputError(f"dtype must be one of {', '.join(DTYPES)}, not {self.dtype!r}")
        if self.device.split(":")[0].strip().lower() == "meta":
            raise InputError("device 'meta' holds no data, so there are no logits to compare: use cpu, cuda, mps...")
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
        unknown = [name for name in self.kernel_classes if name not in KERNEL_CLASSES]
        if unknown or not self.kernel_classes:
            raise InputError(
                f"invariant classes must be some of {', '.join(KERNEL_CLASSES)}, not {self.invariant_classes!r}"
            )
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            # inf would make every text allclose and nan none: neither measures anything (and an integer past a
            # float's range is neither: it overflows where it is used).
            try:
                finite = math.isfinite(float(value))
            except OverflowError:
                finite = False
            if not finite or value < 0:
                shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:37]}..."
                raise InputError(f"{name} must be a finite number >= 0, not {shown}")
        return self

    @property
    def kernel_classes(self) -> tuple[str, ...]:
        """The invariant mode's parts these settings ask for (all four unless `invariant_classes` names some)."""
        if not self.invariant_classes.strip():
            return KERNEL_CLASSES
        return tuple(dict.fromkeys(name.strip() for name in self.invariant_classes.split(",")))

    def with_changes(self, **changes) -> Settings:
        return replace(self, **changes)

    def as_dict(self) -> dict:
        return asdict(self)


# A field's annotation, as the dataclass holds it (a string), read as the types it takes; an int is a float too.
_TYPE_NAMES = {"str": (str,), "int": (int,), "float": (float, int), "bool": (bool,), "None": (None,)}


def field_types(annotation: str) -> tuple:
    """The types a field annotated `annotation` ("str | None", "float") takes, None among them where it may be
    none."""
    return tuple(t for name in annotation.split("|") for t in _TYPE_NAMES[name.strip()])


def restored_settings() -> tuple[str, ...]:
    """The settings a session brings back unless the command line gives them."""
    return tuple(f.name for f in fields(Settings) if f.metadata.get("restored", True))


def option_dest(name: str) -> str:
    """The destination of setting `name`'s command-line option."""
    return next(f.metadata.get("dest", name) for f in fields(Settings) if f.name == name)


def _check_types(settings: Settings) -> None:
    for setting in fields(settings):
        value = getattr(settings, setting.name)
        allowed = field_types(str(setting.type))  # (a string: this module's annotations are postponed)
        if value is None and None in allowed:
            continue
        types = tuple(t for t in allowed if t is not None)
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            names = " or ".join("none" if t is None else t.__name__ for t in allowed)
            raise InputError(f"{setting.name} must be {names}, not {value!r}")
