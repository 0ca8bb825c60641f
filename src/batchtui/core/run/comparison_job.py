"""One comparison of texts batched and alone, as `check` and the app's compare both run it: the texts with their
lines, the settings, and whether each divergent text's first op is looked for (`check --ops`, the app's module
view). The command and the app differ in what they show around it, not in what runs."""

from __future__ import annotations

from dataclasses import dataclass

from ..numbers.comparison import Comparison
from ..settings import Settings
from ..texts import NumberedTexts
from .engine import LogitsSink, compare
from .skeleton import CancelledFn, ProgressFn


@dataclass(frozen=True)
class ComparisonJob:
    texts: NumberedTexts
    settings: Settings
    ops: bool = False  # inside each divergent text's first divergent module, its first op (`run.first_op`)

    def run(
        self,
        progress: ProgressFn | None = None,
        cancelled: CancelledFn | None = None,
        logits_sink: LogitsSink | None = None,
    ) -> Comparison:
        """The comparison (`engine.compare`), then, with `ops` and not cancelled meanwhile, each divergent text's
        first op."""
        texts = self.texts.texts
        result = compare(texts, self.settings, progress, cancelled, self.texts.lines, logits_sink)
        if self.ops and not (cancelled is not None and cancelled()):
            from .first_op import with_first_ops

            result = with_first_ops(result, texts, self.settings)
        return result
