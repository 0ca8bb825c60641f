"""Remedies for batched-vs-single divergence, each applied around a comparison and measured.

A remedy is either a global torch flag set for the duration of a run (restored afterwards,
whatever happens) or a change of settings (eager attention, float32). Flags that do nothing on
the current device say so instead of pretending to have helped.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ..errors import InputError
from ..numbers.comparison import Comparison
from ..one_run import one_run_at_a_time
from ..settings import KERNEL_CLASSES, Settings
from ..terminal.plain import invariant_verdict

if TYPE_CHECKING:
    from ..numbers.generation_result import GenerationComparison

BATCH_INVARIANT_HINT = (
    "pip install git+https://github.com/thinking-machines-lab/batch_invariant_ops (CUDA only); "
    "it replaces mm/addmm/log_softmax/mean and does not cover attention"
)


@contextlib.contextmanager
def _tf32_off() -> Iterator[None]:
    import torch

    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@contextlib.contextmanager
def _reduced_precision_off() -> Iterator[None]:
    import torch

    matmul = torch.backends.cuda.matmul
    saved = matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction
    matmul.allow_bf16_reduced_precision_reduction = matmul.allow_fp16_reduced_precision_reduction = False
    try:
        yield
    finally:
        matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction = saved


@contextlib.contextmanager
def _deterministic() -> Iterator[None]:
    import torch

    saved = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    saved_env = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # cuBLAS needs it for deterministic kernels
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        if saved_env is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = saved_env


@contextlib.contextmanager
def _batch_invariant() -> Iterator[None]:
    from batch_invariant_ops import set_batch_invariant_mode

    with set_batch_invariant_mode(True):
        yield


@one_run_at_a_time()
def _invariant_gap(settings: Settings) -> str | None:
    """What the batch-invariant mode does not cover in the model the settings name (None: it covers it)."""
    from ..invariant.mode import coverage_gap
    from ..models.loading import load_model

    return coverage_gap(load_model(settings).model)


@dataclass(frozen=True)
class Remedy:
    name: str
    description: str
    context: Callable[[], contextlib.AbstractContextManager] | None = None
    settings_change: dict = field(default_factory=dict)
    cuda_only: bool = False
    needs_module: str | None = None
    note: str = ""
    model_gap: Callable[[Settings], str | None] | None = None  # why the loaded model is out of its reach
    outcome_note: Callable[[object], str] | None = None  # the note written from the run's own result

    def why_not(self, device: str) -> str | None:
        """Why this remedy cannot act on `device`, or None when it can."""
        if self.needs_module and importlib.util.find_spec(self.needs_module) is None:
            return f"{self.needs_module} is not installed: {BATCH_INVARIANT_HINT}"
        if self.cuda_only and not device.startswith("cuda"):
            return f"CUDA-only: no effect on {device}"
        return None

    def why_not_for(self, settings: Settings) -> str | None:
        """Why this remedy cannot act with these settings (device, then the model), or None when it can."""
        from ..models.loading import resolve_device

        reason = self.why_not(resolve_device(settings.device))
        if reason is None and self.model_gap is not None:
            reason = self.model_gap(remedied_settings(settings, [self]))
        return reason

    def note_on(self, result) -> str:
        return self.outcome_note(result) if self.outcome_note is not None else self.note


REMEDIES = {
    r.name: r
    for r in (
        Remedy("tf32-off", "TF32 matmuls and convolutions off", _tf32_off, cuda_only=True),
        Remedy(
            "reduced-precision-off",
            "bf16/fp16 reduced-precision reductions in cuBLAS off",
            _reduced_precision_off,
            cuda_only=True,
        ),
        Remedy("deterministic", "torch.use_deterministic_algorithms(True)", _deterministic),
        Remedy("eager-attention", "eager attention instead of SDPA", settings_change={"attn": "eager"}),
        Remedy("float32", "float32 compute", settings_change={"dtype": "float32"}),
        Remedy(
            "batch-invariant",
            "batch_invariant_ops kernels for mm/addmm/log_softmax/mean",
            _batch_invariant,
            cuda_only=True,
            needs_module="batch_invariant_ops",
            note="does not cover attention",
        ),
        Remedy(
            "invariant",
            "batch-invariant mode: row-invariant matmuls and element-wise ops, attention per row",
            settings_change={"invariant": True, "modules": True},  # modules: where it still parts, if it does
            model_gap=_invariant_gap,
            outcome_note=invariant_verdict,
        ),
    )
}


def remedies_named(names: list[str]) -> list[Remedy]:
    """The remedies by name; `invariant:matmul+attention` is the invariant mode with those of its parts alone."""
    unknown = [n for n in names if n not in REMEDIES and not n.startswith("invariant:")]
    if unknown:
        raise InputError(
            f"unknown remedy {unknown[0]!r}; choose from {', '.join(REMEDIES)}, or invariant:CLASS+CLASS "
            f"({'/'.join(KERNEL_CLASSES)})"
        )
    return [REMEDIES.get(n) or _invariant_part(n) for n in dict.fromkeys(names)]


def _invariant_part(name: str) -> Remedy:
    classes = name.split(":", 1)[1].replace("+", ",")
    if not classes.strip(","):
        raise InputError(f"remedy {name!r} names none of the mode's classes ({'/'.join(KERNEL_CLASSES)}) after the ':'")
    Settings(invariant=True, invariant_classes=classes).validated()  # names only the mode's classes
    whole = REMEDIES["invariant"]
    change = {**whole.settings_change, "invariant_classes": classes}
    return replace(whole, name=name, description=f"the batch-invariant mode's {classes.replace(',', ' + ')} alone",
                   settings_change=change)  # fmt: skip


@contextlib.contextmanager
def applied(remedies: list[Remedy]) -> Iterator[None]:
    """Every remedy's flags set for the duration, all restored on the way out."""
    with contextlib.ExitStack() as stack:
        for remedy in remedies:
            if remedy.context is not None:
                stack.enter_context(remedy.context())
        yield


def remedied_settings(settings: Settings, remedies: list[Remedy]) -> Settings:
    changes = {}
    for remedy in remedies:
        changes.update(remedy.settings_change)
    return settings.with_changes(**changes)


@dataclass(frozen=True)
class RemedyOutcome:
    name: str  # a remedy's name, "none" for the baseline, "all" for every applicable one together
    description: str
    applied: bool
    note: str
    comparison: Comparison | GenerationComparison | None


def compare_remedies(texts: list[str], settings: Settings, names: list[str], compare_fn) -> list[RemedyOutcome]:
    """The baseline, then each remedy alone, then (with more than one) all applicable ones together.

    `compare_fn(texts, settings)` runs one measurement (a comparison, or a generation comparison)."""
    remedies = remedies_named(names)
    outcomes = [RemedyOutcome("none", "as configured", True, "", compare_fn(texts, settings))]
    usable = []
    for remedy in remedies:
        reason = remedy.why_not_for(settings)
        if reason is not None:
            outcomes.append(RemedyOutcome(remedy.name, remedy.description, False, reason, None))
            continue
        usable.append(remedy)
        with applied([remedy]):
            result = compare_fn(texts, remedied_settings(settings, [remedy]))
        outcomes.append(RemedyOutcome(remedy.name, remedy.description, True, remedy.note_on(result), result))
    if len(usable) > 1:
        with applied(usable):
            result = compare_fn(texts, remedied_settings(settings, usable))
        note = "; ".join(r.note_on(result) for r in usable if r.outcome_note is not None)
        outcomes.append(RemedyOutcome("all", " + ".join(r.name for r in usable), True, note, result))
    return outcomes
