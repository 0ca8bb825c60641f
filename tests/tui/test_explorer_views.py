"""What the explorer draws, computed in core: overview cells, the top-k union, the token strip, the worst
flip, per-module marks and axis labels. Checked against the comparison's own columns on a real run."""

from __future__ import annotations

import math

import pytest

from batchtui.core import Settings
from batchtui.core.errors import InputError
from batchtui.core.experiments.sweep import parse_batch_sizes, parse_names
from batchtui.core.run.engine import compare
from batchtui.core.visible import shown_token
from batchtui.tui.views.heatmap_cells import bucket_of, heatmap_series, overview_span
from batchtui.tui.views.layers import MARK_LEGEND, fitted_labels, layer_curve
from batchtui.tui.views.navigation import flip_cells, worst_flip
from batchtui.tui.views.tokens import token_strip, topk_union

LONG = "The quick brown fox jumps over the lazy dog. " * 6
# Left-padded with arange positions the shorter texts' positions move: differences past rounding, and on every CPU
# measured some top-1 flips (the last two texts flip on an AVX-512 Xeon where the third alone does not).
TEXTS = ["a", LONG, "Hello, world! How are you today?", "Short one.", "x = [1, 2, 3]; print(x)"]


@pytest.fixture(scope="module")
def comparison():
    return compare(TEXTS, Settings(model="tiny", dtype="bfloat16", positions="arange", top_k=5, modules=True))


def _cells(series) -> dict[tuple[int, int], tuple[int, bool]]:
    return {(y, x): (s.bucket, s.flips) for s in series for x, y in zip(s.positions, s.texts)}


@pytest.mark.parametrize("span", [1, 3, 7, 64])
def test_overview_cells_hold_the_worst_of_their_span(comparison, span):
    cells = _cells(heatmap_series(comparison, 0, None, span))
    for text in comparison.texts:
        diffs, flips = text.columns.max_abs_diff, text.columns.top1_flip
        starts = range(0, len(diffs), span)
        assert {x for (y, x) in cells if y == text.index + 1} == set(starts)
        for start in starts:
            worst = max(diffs[start : start + span])
            assert cells[(text.index + 1, start)] == (bucket_of(worst), any(flips[start : start + span]))


def test_overview_of_a_window_starts_at_its_first_position(comparison):
    cells = _cells(heatmap_series(comparison, 10, 29, 5))
    assert sorted({x for (y, x) in cells if y == 2}) == [10, 15, 20, 25]


def test_overview_span_fits_the_longest_text():
    assert overview_span(40, 55) == 1
    assert overview_span(55, 55) == 1
    assert overview_span(56, 55) == 2
    assert overview_span(4000, 55) == 73 and math.ceil(4000 / 73) <= 55


def test_topk_union_has_every_token_of_both_runs_with_both_probabilities(comparison):
    for text, position in flip_cells(comparison)[:5]:
        p = comparison.texts[text].positions[position]
        rows = topk_union(p)
        assert {r.token for r in rows} == {t.token for t in p.topk_single} | {t.token for t in p.topk_batch}
        by_token = {r.token: r for r in rows}
        for rank, t in enumerate(p.topk_single):
            assert (by_token[t.token].p_single, by_token[t.token].p_batched) == (t.prob, t.prob_in_other)
            assert by_token[t.token].rank_single == rank
        for rank, t in enumerate(p.topk_batch):
            assert (by_token[t.token].p_batched, by_token[t.token].p_single) == (t.prob, t.prob_in_other)
            assert by_token[t.token].rank_batched == rank
        peaks = [max(r.p_single, r.p_batched) for r in rows]
        assert peaks == sorted(peaks, reverse=True)
        # The most probable token in either run is one of the two runs' top-1.
        assert rows[0].token in (p.topk_single[0].token, p.topk_batch[0].token)


def test_token_strip_is_centred_on_the_selection_and_fits(comparison):
    text = comparison.texts[1]
    count = len(text.tokens)
    for position, width in [(0, 30), (count // 2, 30), (count - 1, 30), (count // 2, 7), (count // 2, 1000)]:
        strip = token_strip(text, position, width)
        assert [t.position for t in strip] == list(range(strip[0].position, strip[-1].position + 1))
        assert position in [t.position for t in strip]
        assert sum(len(t.token) + 1 for t in strip) <= max(width, len(text.tokens[position]) + 1)
        if width == 1000:
            assert len(strip) == count
        for t in strip:
            assert t.token == text.tokens[t.position]
            assert t.bucket == bucket_of(text.columns.max_abs_diff[t.position])
            assert t.flip == text.columns.top1_flip[t.position]
        before = position - strip[0].position
        after = strip[-1].position - position
        if strip[0].position > 0 and strip[-1].position < count - 1:
            assert abs(before - after) <= 3  # near the middle where the text goes on both ways


def test_the_strip_shows_the_characters_that_byte_pieces_spell():
    from batchtui.core.models.token_text import CONTINUATION, readable_pieces

    # What the built-in models' tokenizers give for "日本 ok": three byte pieces a character.
    tokens = ["<0xE6>", "<0x97>", "<0xA5>", "<0xE6>", "<0x9C>", "<0xAC>", " o", "k"]
    assert readable_pieces(tokens) == ["日", CONTINUATION, CONTINUATION, "本", CONTINUATION, CONTINUATION, " o", "k"]
    # A piece holding two bytes, a byte that starts no character, a character cut at the text's end.
    assert readable_pieces(["<0xE6><0x97>", "<0xA5>", "<0xFF>", "<0x41>", "<0xE6>"]) == [
        "日",
        CONTINUATION,
        "<0xFF>",
        "A",
        "<0xE6>",
    ]


def test_a_cjk_text_reads_as_its_characters_in_the_strip():
    comparison = compare(["日本語のテキスト ok"], Settings(model="qwen2-english-4m", dtype="float32"))
    text = comparison.texts[0]
    strip = token_strip(text, 0, 1000)
    assert "".join(t.label for t in strip if t.label != "·").startswith("日本語のテキスト")
    assert [t.token for t in strip] == list(text.tokens)  # the tokens themselves stay bytes


def test_worst_flip_is_the_flip_with_the_largest_max_abs_diff(comparison):
    flips = flip_cells(comparison)
    assert flips, "bf16 with arange positions flips on the built-in model"
    text, position = worst_flip(comparison)
    assert (text, position) in flips
    largest = max(comparison.texts[t].columns.max_abs_diff[p] for t, p in flips)
    assert comparison.texts[text].columns.max_abs_diff[position] == largest


def test_per_module_marks_say_what_each_point_is(comparison):
    curve = layer_curve(comparison.texts[1], modules=True)
    assert len(curve.marks) == len(curve.names)
    assert curve.marks[0] == "e" and curve.marks[-1] == "o"
    assert {"a", "m", "n", "L"} <= set(curve.marks)  # attention, MLP, norms and each layer's output
    for mark in set(curve.marks):
        assert f"{mark} " in MARK_LEGEND
    layers = layer_curve(comparison.texts[1])
    assert layers.marks.count("L") == len(layers.names) - 3  # embeddings, final norm and logits apart


def test_fitted_labels_keep_every_tick_and_never_overlap():
    labels = [str(i) for i in range(28)]
    positions = list(range(28))
    for columns in (20, 40, 60, 200):
        kept = fitted_labels(positions, labels, 28, columns)
        assert len(kept) == 28 and kept[0] == "0"
        spans = [
            (round(p * (columns - 1) / 27) - len(label) // 2, len(label)) for p, label in zip(positions, kept) if label
        ]
        assert all(a + n < b for (a, n), (b, _) in zip(spans, spans[1:]))  # a space between labels
        if columns == 200:
            assert kept == labels  # all fit
        if columns == 20:
            assert kept.count("") > 0


def test_shown_token_makes_whitespace_visible():
    assert shown_token(" the") == "␣the"
    assert shown_token("\n") == "\\n"
    assert shown_token("") == "∅"
    assert shown_token("\x1b[31m") == "\\x1b[31m"
    assert shown_token(" abcdefghij", 5) == "␣abc…"


def test_sweep_grid_values_are_parsed_or_refused_with_a_message():
    assert parse_names(" bfloat16, float32 ,") == ["bfloat16", "float32"]
    assert parse_batch_sizes("1,2, 4") == [1, 2, 4]
    for bad in ("", "1,x", "0,2", "-1"):
        with pytest.raises(InputError):
            parse_batch_sizes(bad)
