"""Chart colours as RGB, given to plotext and to the legends drawn beside the charts alike."""

from __future__ import annotations

SINGLE = (90, 150, 235)
BATCHED = (255, 153, 51)
DTYPES = {"bfloat16": (255, 153, 51), "float16": (220, 90, 220), "float32": (70, 200, 210), "float64": (100, 200, 100)}
OTHER = (200, 200, 200)


def rich(rgb: tuple[int, int, int]) -> str:
    """The same colour as a rich style."""
    return "rgb({},{},{})".format(*rgb)


# A letter per dtype for the points of a chart: `b`float16, `h`alf, `f`loat32, `d`ouble.
DTYPE_MARKS = {"bfloat16": "b", "float16": "h", "float32": "f", "float64": "d"}


def dtype_mark(dtype: str) -> str:
    return DTYPE_MARKS.get(dtype, "•")
