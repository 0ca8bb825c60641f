"""Loading a causal LM and its tokenizer: built-in names, local folders and Hub ids."""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ..compat.transformers import attn_implementation, experts_kwargs
from ..errors import BatchtuiError, InputError, ModelLoadError
from ..one_run import one_run_at_a_time
from ..settings import Settings
from ..visible import literal
from .builtin import builtin_names, builtin_path
from .source import first_line, hub_files_only, load_failure_message, source_problem
from .structure import Structure, discover
from .token_text import token_label


@dataclass
class LoadedModel:
    """A model ready for forward passes, with what the report says about how it was loaded."""

    name: str
    model: Any  # a transformers causal LM: any architecture, so duck-typed
    tokenizer: Any
    device: str
    dtype: str  # resolved, never "auto"
    attn: str
    pad_token_id: int
    vocab_size: int
    max_tokens: int  # the longest input the model takes (its context), the default cut for texts
    structure: Structure  # layers, sub-modules, final norm and routers, as the probe pass saw them run
    notes: tuple[str, ...] = ()
    # Decoded strings of the ids seen so far: top-k asks for the same ids over and over.
    token_texts: dict[int, str] = field(default_factory=dict, repr=False)

    def decode(self, token_ids: list[int]) -> None:
        """Make sure every id in `token_ids` has its decoded string in `token_texts`."""
        missing = [i for i in token_ids if i not in self.token_texts]
        if missing:
            decoded = self.tokenizer.batch_decode([[i] for i in missing])
            pieces = self.tokenizer.convert_ids_to_tokens(missing)
            # Ids past the tokenizer's vocabulary (padded embedding rows) decode to nothing.
            self.token_texts.update(
                (i, token_label(text, piece) or f"<id={i}>") for i, text, piece in zip(missing, decoded, pieces)
            )


_lock = threading.Lock()
# The model in use and, with --reference, its float64 twin on the CPU; older ones are dropped.
_CACHE_SIZE = 2
_cached: OrderedDict[tuple, LoadedModel] = OrderedDict()


def resolve_device(device: str) -> str:
    import torch

    if device != "auto":
        return device
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def load_model(settings: Settings) -> LoadedModel:
    """Load (or reuse) the model the settings name.

    A dtype change loads the weights again: casting a loaded model is not the same as loading in
    that dtype (it also casts buffers such as the rotary frequencies, which changes the logits).
    """
    device = resolve_device(settings.device)
    key = (settings.model, device, settings.device_map, settings.attn, settings.dtype, settings.trust_remote_code)
    with one_run_at_a_time(), _lock:  # a model's probe pass is a run's
        if key in _cached:
            _cached.move_to_end(key)
            return _cached[key]
        while len(_cached) >= _CACHE_SIZE:  # free before loading the next one
            _cached.popitem(last=False)
        loaded = _load(settings, device)
        _cached[key] = loaded
        return loaded


def load_tokenizer(name: str):
    """Model `name`'s tokenizer alone, from this machine's files (a built-in, a folder, the Hub's cache; never
    downloaded, never its own code), or None where it is not here: for showing tokens a file names."""
    from transformers import AutoTokenizer

    if not name:
        return None
    source = _source(name)
    if source == name and source_problem(source):
        return None
    try:
        with _transformers_quiet():
            return AutoTokenizer.from_pretrained(source, trust_remote_code=False, local_files_only=True)
    except Exception:  # noqa: BLE001 - not here, or not a tokenizer: the tokens are shown by id
        return None


def _source(name: str) -> str:
    if name in builtin_names():
        return str(builtin_path(name))
    return name


def _dtype_name(model) -> str:
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def _load(settings: Settings, device: str) -> LoadedModel:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    source = _source(settings.model)
    if source == settings.model and (problem := source_problem(source)):
        raise ModelLoadError(problem)
    trust = settings.trust_remote_code
    try:
        cache_only = source == settings.model and hub_files_only(source)
        with _transformers_quiet():
            tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust, local_files_only=cache_only)
        kwargs = {"dtype": "auto" if settings.dtype == "auto" else getattr(torch, settings.dtype)}
        kwargs.update(experts_kwargs(settings.dtype))
        kwargs["local_files_only"] = cache_only
        if settings.attn:
            kwargs["attn_implementation"] = settings.attn
        if settings.device_map:
            _require_accelerate()
            kwargs["device_map"] = settings.device_map
        with _transformers_quiet():  # its load report is ours to say, in one line (below)
            loaded: Any = AutoModelForCausalLM.from_pretrained(
                source, trust_remote_code=trust, output_loading_info=True, **kwargs
            )
            model, loading = loaded  # with `output_loading_info`, a pair
        _refuse_missing_weights(settings.model, loading)
    except BatchtuiError:
        raise
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError... for a bad source
        raise ModelLoadError(load_failure_message(settings.model, source, settings.attn, exc)) from exc
    if settings.device_map:
        # Sharded by accelerate: inputs go where the embeddings are; metrics gather to the logits' device.
        device = str(model.get_input_embeddings().weight.device)
        model = model.eval()
    else:
        try:
            model = model.to(device).eval()
        except (RuntimeError, AssertionError) as exc:
            raise InputError(f"cannot use device {device!r}: {first_line(exc)}") from exc
    _refuse_short_embedding(settings.model, model, tokenizer)
    try:
        structure = discover(model, device)
    except Exception as exc:  # noqa: BLE001 - a model that cannot run a 6-token pass cannot be compared
        raise ModelLoadError(
            f"cannot run model {settings.model!r} in {_dtype_name(model)} on {device}: {first_line(exc)}"
        ) from exc
    if not structure.causal and not structure.finite:  # NaN is unlike itself: it reads as earlier positions changed
        raise ModelLoadError(
            f"model {settings.model!r} gives NaN or inf logits for a 6-token text in {_dtype_name(model)} on "
            f"{device}: its weights hold them, or this dtype overflows (another --dtype may not)"
        )
    if not structure.causal:
        raise ModelLoadError(
            f"model {settings.model!r} is not a causal LM: changing the last token changed the logits at "
            "earlier positions (an encoder such as BERT?); batched-vs-single comparison needs a causal LM"
        )
    notes = []
    if _ignores_position_ids(model, device):
        notes.append(
            f"model {literal(settings.model, 60)} ignores position_ids (it derives positions itself): "
            "--positions changes nothing for it"
        )
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        if tokenizer.eos_token_id is None:
            raise ModelLoadError(f"tokenizer of {settings.model!r} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
        pad_id = tokenizer.eos_token_id
        notes.append(f"tokenizer has no pad token: padding with its eos token {tokenizer.eos_token!r}")
    return LoadedModel(
        name=settings.model,
        model=model,
        tokenizer=tokenizer,
        device=device,
        dtype=_dtype_name(model),
        attn=str(attn_implementation(model.config) or "default"),
        pad_token_id=int(pad_id),
        vocab_size=int(model.get_output_embeddings().weight.shape[0]),
        max_tokens=_context_length(model, tokenizer),
        structure=structure,
        notes=tuple(notes),
    )


def _refuse_short_embedding(name: str, model, tokenizer) -> None:
    """A tokenizer with more tokens than the checkpoint has embedding rows makes ids that index past the table
    (an IndexError deep in the first forward): another model's tokenizer. Refused at load, in words."""
    rows = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > rows:
        raise ModelLoadError(
            f"model {literal(name, 60)!r}: its tokenizer has {len(tokenizer)} tokens but its embedding only {rows} "
            f"rows, so ids from {rows} on have none: the tokenizer is not this checkpoint's"
        )


@contextlib.contextmanager
def _transformers_quiet():
    from huggingface_hub.utils import logging as hub_logging
    from transformers.utils import logging as hf_logging

    # What went wrong reaches the user in our one line, not as the hub's retry warnings on the terminal.
    saved = hf_logging.get_verbosity(), hub_logging.get_verbosity()
    hf_logging.set_verbosity(hf_logging.CRITICAL)
    hub_logging.set_verbosity(hub_logging.CRITICAL)
    try:
        yield
    finally:
        hf_logging.set_verbosity(saved[0])
        hub_logging.set_verbosity(saved[1])


def _refuse_missing_weights(name: str, loading: dict) -> None:
    """A checkpoint that lacks weights the model needs (or has them in another shape) loads with those
    initialised at random, different on every load: nothing it computes is the checkpoint's. Refused."""
    missing = [*loading.get("missing_keys", ()), *(m[0] for m in loading.get("mismatched_keys", ()))]
    if missing:
        shown = ", ".join(literal(key, 60) for key in list(missing)[:3]) + (", ..." if len(missing) > 3 else "")
        raise ModelLoadError(
            f"checkpoint {literal(name, 60)} lacks {len(missing)} weights the model needs ({shown}): they would "
            "be random, different on every load; refused (is it a causal LM checkpoint of this architecture?)"
        )


def _ignores_position_ids(model, device: str) -> bool:
    """Whether shifting position_ids leaves the logits unchanged (ALiBi models, and models that derive
    positions from the mask): the positions setting then has no effect, and the report says so."""
    import torch

    ids = torch.arange(3, 9, device=device)[None].remainder(model.get_input_embeddings().weight.shape[0])
    positions = torch.arange(6, device=device)[None]
    with torch.inference_mode():
        first = model(input_ids=ids, position_ids=positions, use_cache=False).logits
        shifted = model(input_ids=ids, position_ids=positions + 5, use_cache=False).logits
    return torch.equal(first, shifted)


def _context_length(model, tokenizer) -> int:
    """The model's context: its position limit, or the tokenizer's if that is smaller and real."""
    given = [getattr(model.config, "max_position_embeddings", None), getattr(tokenizer, "model_max_length", None)]
    limits = [int(n) for n in given if isinstance(n, int) and 0 < n < 10**8]  # 1e30 means "no limit"
    return min(limits, default=10**8)


def _require_accelerate() -> None:
    import importlib.util

    if importlib.util.find_spec("accelerate") is None:
        raise InputError("--device-map needs accelerate: pip install 'batchtui[multi-gpu]' (or accelerate)")
