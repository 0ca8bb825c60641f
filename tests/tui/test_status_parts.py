"""The status line's fitting: the most important parts first, none cut in half, the rest announced."""

from __future__ import annotations

from batchtui.core.visible import columns
from batchtui.tui.views.status import MORE, SEPARATOR, StatusPart, fit_status

PARTS = [
    StatusPart("last run failed: cannot load model 'x'", "error"),
    StatusPart("2/6 texts diverge · 1 flip"),
    StatusPart("qwen2-english-4m · cpu · bfloat16"),
    StatusPart("no divergence: right padding (p), arange positions (o) or another dtype (d) usually shows one"),
    StatusPart("last run 0.91 s"),
]


def _line(shown, left_out) -> str:
    return SEPARATOR.join(p.text for p in shown) + (SEPARATOR + MORE if left_out else "")


def test_everything_fits_on_a_wide_line_in_the_order_given():
    shown, left_out = fit_status(PARTS, 400)
    assert shown == PARTS and left_out == 0


def test_a_narrow_line_keeps_the_error_first_drops_parts_whole_and_says_so():
    for width in (60, 80, 120):
        shown, left_out = fit_status(PARTS, width)
        assert shown[0] == PARTS[0] and left_out == len(PARTS) - len(shown) > 0
        assert all(part in PARTS for part in shown)  # whole parts only, in their order
        assert [PARTS.index(p) for p in shown] == sorted(PARTS.index(p) for p in shown)
        assert columns(_line(shown, left_out)) <= width
    shown, _ = fit_status(PARTS, 80)
    assert shown[:2] == PARTS[:2]  # the error, then how the run came out


def test_a_first_part_wider_than_the_line_is_cut_never_dropped():
    shown, left_out = fit_status(PARTS, 20)
    assert shown[0].kind == "error" and shown[0].text.endswith("…") and left_out == len(PARTS) - 1
    assert columns(_line(shown, left_out)) <= 20


def test_empty_parts_take_no_room():
    shown, left_out = fit_status([StatusPart(""), StatusPart("ok")], 10)
    assert [p.text for p in shown] == ["ok"] and left_out == 0


def test_the_run_status_reads_most_important_first():
    """The explorer state's `RunStatus` as the line says it: the error first (its first line, escaped), the
    remote-code warning, the activity with a running run's seconds, the setup, then the rest."""
    from batchtui.tui.views.status import RunStatus, setup_words, status_parts

    status = RunStatus(
        setup=setup_words("tiny", "cpu", "bfloat16", auto=True),
        trust_remote_code=True,
        activity=("3 of 5 texts diverge", "worst text 2"),
        run_started=100.0,
        last_run_s=1.234,
        blank_lines=1,
        error="boom\x1b[31m\nsecond line",
    )
    texts = [part.text for part in status_parts(status, now=107.4) if part.text]
    assert texts == [
        "last run failed: boom\\x1b[31m",
        "TRUST REMOTE CODE ON",
        "3 of 5 texts diverge · 7 s",
        "tiny · cpu · bfloat16 (auto)",
        "worst text 2",
        "last run 1.23 s",
        "1 blank line skipped",
    ]
    assert [p.kind for p in status_parts(status, now=107.4)][:2] == ["error", "warning"]
    idle = [part.text for part in status_parts(RunStatus(), now=0.0) if part.text]
    assert idle == ["starting…"]
