"""Moving over a comparison's cells (core/cell_navigation.py), on synthetic comparisons with known answers."""

from __future__ import annotations

from helpers.factories import make_comparison, make_text

from batchtui.tui.views.heatmap_cells import divergent_cells
from batchtui.tui.views.navigation import (
    clamp_cell,
    flip_cells,
    next_divergent,
    next_flip,
    summary_order,
    worst_flip,
)

# Text 0: equal; text 1: diverges at 1 and 3, flips at 3; text 2: flips at 0 (a larger Δ), diverges at 2.
COMPARISON = make_comparison(
    make_text(0, [0.0, 0.0, 0.0]),
    make_text(1, [0.0, 0.01, 0.0, 0.02], flips={3}),
    make_text(2, [0.5, 0.0, 0.001], flips={0}),
)


def test_divergent_cells_and_flips_in_reading_order():
    assert divergent_cells(COMPARISON) == [(1, 1), (1, 3), (2, 0), (2, 2)]
    assert flip_cells(COMPARISON) == [(1, 3), (2, 0)]


def test_next_and_previous_wrap_around_across_texts():
    assert next_divergent(COMPARISON, 0, 0) == (1, 1)
    assert next_divergent(COMPARISON, 1, 3) == (2, 0)
    assert next_divergent(COMPARISON, 2, 2) == (1, 1)  # wraps
    assert next_divergent(COMPARISON, 1, 1, forward=False) == (2, 2)  # wraps back
    assert next_flip(COMPARISON, 1, 3) == (2, 0)
    assert next_flip(COMPARISON, 2, 0) == (1, 3)


def test_worst_flip_is_the_flip_with_the_largest_difference_else_the_worst_divergence_else_none():
    assert worst_flip(COMPARISON) == (2, 0)
    no_flip = make_comparison(make_text(0, [0.0, 0.01]), make_text(1, [0.03, 0.0, 0.03]))
    assert worst_flip(no_flip) == (1, 0)  # first in reading order on a tie
    assert worst_flip(make_comparison(make_text(0, [0.0, 0.0]), make_text(1, [0.0]))) is None


def test_summary_orders_put_the_worst_first_and_keep_ties_in_text_order():
    assert summary_order(COMPARISON, "text") == [0, 1, 2]
    assert summary_order(COMPARISON, "max|Δ|") == [2, 1, 0]
    assert summary_order(COMPARISON, "flips") == [2, 1, 0]  # one flip each: the larger max|Δ| first
    assert summary_order(COMPARISON, "KL") == [2, 1, 0]
    # Without flips or KL the allclose text still comes last: never above a divergent one.
    quiet = make_comparison(make_text(0, [0.0]), make_text(1, [1e-9, 0.001]))
    assert summary_order(quiet, "flips") == [1, 0]


def test_a_cell_past_a_text_s_end_is_clamped_to_it():
    assert clamp_cell(COMPARISON, 0, 10) == (0, 2)
    assert clamp_cell(COMPARISON, 9, 1) == (2, 1)
    assert clamp_cell(COMPARISON, -1, -1) == (0, 0)
