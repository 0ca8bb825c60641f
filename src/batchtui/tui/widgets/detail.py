"""The selected (text, position): its numbers, the tokens around it, and the top-k tokens of both runs
side by side."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from ...core.numbers.comparison import Comparison, PositionMetrics, TextResult
from ...core.terminal.plain import decimals_to_tell_apart, format_float
from ...core.visible import columns, literal, packed, shown_token
from ..views.layers import routing_changes_at
from ..views.tokens import token_strip
from .heatmap import BUCKET_COLORS
from .topk_table import topk_table


def detail_title(line: int, position: int) -> str:
    """`text N · position M`: N the text's line, as in the summary table and the editor; M the token index."""
    return f"text {line} · position {position}"


class DetailPane(VerticalScroll, can_focus=True):
    """Scrolls where its lines do not fit (a short screen, a long first-op cause): Tab reaches it, ↑/↓ and the
    page keys scroll it, and its title says when lines are out of view."""

    DEFAULT_CSS = """
    DetailPane > Horizontal {
        height: auto;
    }

    #detail-numbers {
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }

    #detail-strip {
        height: 1;
    }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = "detail"
        self._shape: tuple[int, int] | None = None  # (number lines, top-k rows) last laid out
        self._batched_with_others = False  # the comparison on screen batched texts together

    def compose(self) -> ComposeResult:
        yield Static(id="detail-numbers")
        yield Static(id="detail-strip")
        yield Static(id="detail-topk")

    def show(self, comparison: Comparison | None, selected: tuple[int, int]) -> None:
        numbers = self.query_one("#detail-numbers", Static)
        topk = self.query_one("#detail-topk", Static)
        if comparison is None or not comparison.texts:
            numbers.update(Text("no comparison yet"))
            topk.update("")
            return
        text, position = selected
        result = comparison.texts[text]
        self._batched_with_others = min(comparison.config["batch_size"], len(comparison.texts)) > 1
        self.border_title = detail_title(result.line, position)
        metrics = result.position(position)
        content = self._numbers(metrics) + self._causes(result, position)
        # Moving the selection must not re-lay-out the screen: sizes change only with the content's shape.
        lines = len(content.split())
        topk_rows = len(metrics.topk_single) + 1
        resize = (lines, topk_rows) != self._shape
        if resize:
            self._shape = (lines, topk_rows)
            numbers.styles.height = lines
            topk.styles.height = topk_rows
        numbers.update(content, layout=resize)
        self.query_one("#detail-strip", Static).update(self._strip(result, position), layout=False)  # one line always
        topk.update(topk_table(metrics, self._width(), self._color("warning")), layout=resize)
        self.call_after_refresh(self._say_what_is_cut, detail_title(result.line, position))

    def _say_what_is_cut(self, title: str) -> None:
        """Where the lines do not fit, the title says how to reach them: Tab, then ↓ and the page keys."""
        cut = self.max_scroll_y > 0
        self.border_title = f"{title} · more ↓ (tab)" if cut else title

    def _strip(self, result: TextResult, position: int) -> Text:
        """The text's tokens around the selection, each in its heatmap colour, flips marked, the selected
        one reversed: where in the text this position is."""
        strip = Text(no_wrap=True, overflow="crop")
        for token in token_strip(result, position, self.content_size.width, lambda t: columns(shown_token(t, 12))):
            style = f"color({BUCKET_COLORS[token.bucket]})"
            if token.position == position:
                style += " bold reverse"
            elif token.flip:
                style += " underline"
            strip.append(shown_token(token.label, 12), style=style)
            strip.append(" ")
        return strip

    def _numbers(self, p: PositionMetrics) -> Text:
        """The position's numbers as items packed into lines of the pane's width: never cut, never split."""
        warning, error = self._color("warning"), f"bold {self._color('error')}"
        items = [
            (f"token {literal(repr(p.token))} (id {p.token_id})", ""),
            (f"max|Δ| {format_float(p.max_abs_diff)}", ""),
            (f"= {p.max_abs_diff_ulp:.3g} ulp", ""),
            (f"KL {format_float(p.kl)}", ""),
            (f"margin {format_float(p.margin)}" + ("" if p.margin_ulp is None else f" ({p.margin_ulp:.3g} ulp)"), ""),
        ]
        if p.near_tie and p.top1_flip:  # why rounding-sized differences could change the choice
            items.append(("near-tie: margin ≤ 2·max|Δ|", warning))
        if p.top1_flip:
            # Each run's choice and, beside it, the other run's choice in this run: digits enough to tell them
            # apart (11.1875 vs 11.1250, not 11.19 twice), and "tied" where they are the same number.
            pairs = [
                (head, run[0], next((t for t in run if t.id == other[0].id), None))
                for head, run, other in (
                    ("TOP-1 FLIP: batched", p.topk_batch, p.topk_single),
                    ("single", p.topk_single, p.topk_batch),
                )
            ]
            logits = [t.logit for _, chosen, rival in pairs for t in (chosen, rival) if t is not None]
            decimals = decimals_to_tell_apart(logits, least=3)
            for head, chosen, rival in pairs:
                items.append((f"{head} → {literal(repr(chosen.token))} {chosen.logit:.{decimals}f}", error))
                if rival is None:
                    items.append(("(the other run's choice not in its top-k)", error))
                else:
                    tied = " (tied)" if rival.logit == chosen.logit else ""
                    items.append((f"over {literal(repr(rival.token))} {rival.logit:.{decimals}f}{tied}", error))
        elif not p.allclose:
            items.append(("not allclose (top-1 unchanged)", warning))
        else:
            items.append(("allclose", self._color("success")))
        width = max(self.content_size.width, 20)
        text = Text()
        for number, line in enumerate(packed([item for item, _ in items], width)):
            if number:
                text.append("\n")
            for place, index in enumerate(line):
                text.append(("  " if place else "") + items[index][0], style=items[index][1])
        return text

    def _causes(self, result: TextResult, position: int) -> Text:
        """MoE routing changes at this token, why a text is bitwise equal, the text's batch-size vs padding
        split and its errors against float64, when measured; each wrapped between words at the pane's width."""
        said: list[tuple[str, str]] = []
        for change in routing_changes_at(result, position):
            said.append(
                (
                    f"expert routing changed here: layer {change.layer} experts {list(change.experts_batched)}"
                    f" batched vs {list(change.experts_single)} single",
                    f"bold {self._color('warning')}",
                )
            )
        if result.first_op is not None:
            op = result.first_op
            said.append((f"text first parts at {op.op} in {op.module}: {op.cause()}", f"bold {self._color('warning')}"))
        if not result.padding and result.bitwise_equal and self._batched_with_others:
            said.append(("text: no pad tokens (the longest of its batch), the same inputs as alone: bitwise equal", ""))
        if result.truncated:
            said.append((f"text cut to its first {len(result.token_ids)} tokens (--max-tokens)", ""))
        if result.decomposition is not None:
            d = result.decomposition
            effects = (
                f"batch-size effect {format_float(d.batch_effect)} · padding effect {format_float(d.padding_effect)}"
            )
            said.append((f"text: {effects}", ""))
        if result.reference is not None:
            r = result.reference
            said.append((f"vs float64: batched {format_float(r.batched)} · single {format_float(r.single)}", ""))
        text = Text()
        width = self._width()
        for sentence, style in said:
            words = sentence.split(" ")
            for line in packed(words, width, " "):
                text.append("\n" + " ".join(words[i] for i in line), style=style)
        return text

    def _width(self) -> int:
        """The columns a line may take: the pane's, less its scrollbar's (kept whether or not it shows, so that a
        line never changes its wrapping as the scrollbar comes and goes)."""
        return max(self.content_size.width - self.styles.scrollbar_size_vertical, 20)

    def _color(self, name: str) -> str:
        return self.app.theme_variables.get(name, "white")
