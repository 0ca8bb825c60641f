"""The selected (text, position): its numbers, the tokens around it, and the top-k tokens of both runs
side by side."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from ..core.comparison import Comparison, PositionMetrics, TextResult
from ..core.plain_text import decimals_to_tell_apart, format_float
from ..core.views import routing_changes_at, token_strip
from ..core.visible import columns, literal, shown_token
from .heatmap import BUCKET_COLORS
from .topk_table import topk_table


def detail_title(line: int, position: int) -> str:
    """`text N · position M`: N the text's line, as in the summary table and the editor; M the token index."""
    return f"text {line} · position {position}"


class DetailPane(Vertical):
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
        metrics = result.positions[position]
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
        self.query_one("#detail-strip", Static).update(self._strip(result, position))
        topk.update(topk_table(metrics, self.content_size.width, self._color("warning")), layout=resize)

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
        line = Text.assemble(
            "token ",
            (literal(repr(p.token)), "bold"),
            f" (id {p.token_id})  max|Δ| {format_float(p.max_abs_diff)}",
            f"\n= {p.max_abs_diff_ulp:.3g} ulp  KL {format_float(p.kl)}  margin {format_float(p.margin)}",
        )
        if p.near_tie and p.top1_flip:  # why rounding-sized differences could change the choice
            line.append(" ≤ 2·max|Δ|: a near-tie", style=self._color("warning"))
        line.append("\n")
        if p.top1_flip:
            batched, single = p.topk_batch[0], p.topk_single[0]
            # Digits enough to see the two logits differ (a near-tie is 11.1875 vs 11.1882, not 11.19 twice).
            decimals = decimals_to_tell_apart([t.logit for t in (*p.topk_batch[:2], *p.topk_single[:2])], least=3)
            said = (
                f"batched → {literal(repr(batched.token))} {batched.logit:.{decimals}f}",
                f"single → {literal(repr(single.token))} {single.logit:.{decimals}f}",
            )
            head = "TOP-1 FLIP (near-tie): " if p.near_tie else "TOP-1 FLIP: "
            # One line where the pane is wide enough, else the two runs one under the other: never cut.
            flip = f"{head}{' · '.join(said)}"
            if len(flip) > self.content_size.width:
                flip = f"{head}{said[0]}\n{' ' * len(head)}{said[1]}"
            line.append(flip, style=f"bold {self._color('error')}")
        elif not p.allclose:
            line.append("not allclose (top-1 unchanged)", style=self._color("warning"))
        else:
            line.append("allclose", style=self._color("success"))
        return line

    def _causes(self, result: TextResult, position: int) -> Text:
        """MoE routing changes at this token, the text's batch-size vs padding split and its errors
        against float64, when measured."""
        line = Text()
        for change in routing_changes_at(result, position):
            line.append(
                f"\nexpert routing changed here: layer {change.layer} experts {list(change.experts_batched)}"
                f" batched vs {list(change.experts_single)} single",
                style=f"bold {self._color('warning')}",
            )
        if not result.padding and result.bitwise_equal and self._batched_with_others:
            line.append("\ntext: no pad tokens (the longest of its batch): the same inputs as alone, bitwise equal")
        if result.truncated:
            line.append(f"\ntext cut to its first {len(result.token_ids)} tokens (--max-tokens)")
        if result.decomposition is not None:
            d = result.decomposition
            line.append(
                f"\ntext: batch-size effect {format_float(d.batch_effect)}"
                f" · padding effect {format_float(d.padding_effect)}"
            )
        if result.reference is not None:
            r = result.reference
            line.append(f"\nvs float64: batched {format_float(r.batched)} · single {format_float(r.single)}")
        return line

    def _color(self, name: str) -> str:
        return self.app.theme_variables.get(name, "white")
