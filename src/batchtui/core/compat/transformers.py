"""transformers: the differences between its releases that the engine bridges (from 5.19, the lowest pyproject.toml
claims and CI tests), and the private names of its models and configs it reads (the attention implementation a
config holds, whether a model takes another)."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator


def experts_kwargs(dtype: str) -> dict:
    """MoE checkpoints: transformers picks a `grouped_mm` experts kernel that has no float64; the eager experts loop
    computes every dtype."""
    return {"experts_implementation": "eager"} if dtype == "float64" else {}


def module_output(output):
    """A module's output tensor: a decoder layer returns it, an attention module a tuple whose first item it is."""
    return output[0] if isinstance(output, tuple) else output


def cache_of(output):
    """The cache a forward pass returned (None: none): `cache` in transformers' newer models, `past_key_values`
    before (still an alias there, with a deprecation warning)."""
    cache = output.get("cache")
    return output.get("past_key_values") if cache is None else cache


def cache_kwarg(model) -> str:
    """The keyword `model`'s forward takes a cache by: `cache` in transformers' newer models (`past_key_values` is
    deprecated there, and goes in 5.40), `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def attn_implementation(config) -> str | None:
    """The attention implementation `config` holds (None: not set)."""
    return getattr(config, "_attn_implementation", None)


def holds_attn_implementation(config) -> bool:
    """Whether `config` is one that holds an attention implementation (a model's, a sub-model's)."""
    return hasattr(config, "_attn_implementation")


def attn_implementation_field(config) -> str:
    """The attribute that stores `config`'s attention implementation: transformers 5 keeps the value behind a
    property whose setter also rewrites the sub-configs, so it is set where the value lies."""
    return (
        "_attn_implementation_internal" if hasattr(config, "_attn_implementation_internal") else "_attn_implementation"
    )


def takes_attention_interface(model) -> bool:
    """Whether `model` computes its attention through transformers' attention interface (an implementation can be
    set on it), not inside its own code."""
    can_set = getattr(type(model), "_can_set_attn_implementation", None)
    return bool(can_set()) if can_set is not None else False


def supports_sdpa(model) -> bool:
    return bool(getattr(model, "_supports_sdpa", False))


@contextlib.contextmanager
def packed_sequences_found() -> Iterator[list[bool]]:
    """Inside the block, each time a model's mask reads its position ids for packed sequences (transformers'
    `masking_utils.find_packed_sequence_indices`, called where no attention mask is given), whether it found them
    (several sequences in a row, each attending to itself only)."""
    from transformers import masking_utils

    own = masking_utils.find_packed_sequence_indices
    found: list[bool] = []

    def finding(position_ids):
        sequences = own(position_ids)
        found.append(sequences is not None)
        return sequences

    masking_utils.find_packed_sequence_indices = finding
    try:
        yield found
    finally:
        masking_utils.find_packed_sequence_indices = own
