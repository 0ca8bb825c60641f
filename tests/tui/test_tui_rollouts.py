"""The rollouts view (`batchtui --rollouts FILE --model M`): scored in a worker with progress, then the metrics,
both histograms and the worst sequences; enter opens a sequence's tokens, the heatmap's keys move along them and
between sequences; a file that cannot be scored is said on screen and the app carries on."""

from __future__ import annotations

import pytest
from rollout_files import sampled_rollouts, write_jsonl
from textual.widgets import DataTable, Static
from textual_plotext import PlotextPlot
from tui_helpers import wait_for

from batchtui.core import Settings
from batchtui.core.rollouts.job import RolloutsJob
from batchtui.core.terminal.rollouts_text import metric_rows
from batchtui.tui.launcher import build_app
from batchtui.tui.rollouts_app import RolloutsApp
from batchtui.tui.screens.rollouts_screen import RolloutsScreen, RolloutTokensScreen


@pytest.fixture(scope="module")
def rollouts(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("tui-rollouts") / "in.jsonl", sampled_rollouts("tiny", 8, new_tokens=6))


def _text(widget: Static) -> str:
    return str(widget.render())


async def test_the_view_shows_the_summary_and_a_sequence_s_tokens_under_the_heatmap_s_keys(rollouts):
    app = RolloutsApp(RolloutsJob(str(rollouts), Settings(model="tiny", dtype="float32"), 40))
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, RolloutsScreen)
        await wait_for(pilot, lambda: screen.summary is not None, "the scoring")
        summary = screen.summary
        assert summary.metrics.sequences == 8
        metrics = screen.query_one("#rollouts-metrics", DataTable)
        assert metrics.row_count == len(metric_rows(summary))
        worst = screen.query_one("#rollouts-worst", DataTable)
        assert worst.row_count == len(summary.worst_sequences) == 8
        assert str(worst.get_row_at(0)[0]) == str(summary.worst_sequences[0].line)
        assert "8 sequences, 48 tokens" in _text(screen.query_one("#rollouts-status", Static))
        assert len(screen.query(PlotextPlot)) == 2
        await pilot.press("down", "enter")  # the second worst sequence's tokens
        tokens = app.screen
        assert isinstance(tokens, RolloutTokensScreen) and tokens.index == 1
        sequence = summary.worst_sequences[1]
        assert tokens.query_one(DataTable).row_count == len(sequence.tokens) == 6
        detail = tokens.query_one("#tokens-detail", Static)
        assert f"line {sequence.line}, step 0 of 6" in _text(detail)
        await pilot.press("right", "l")
        assert tokens.step == 2 and "step 2 of 6: " in _text(detail)
        t = sequence.tokens[2]
        assert f"trainer {t.trainer:.6f} · sampler {t.sampler:.6f}" in _text(detail)
        await pilot.press("end")
        assert tokens.step == 5 and tokens.query_one(DataTable).cursor_row == 5
        await pilot.press("home")
        assert tokens.step == 0
        await pilot.press("j")  # the next worst sequence
        assert tokens.index == 2 and f"line {summary.worst_sequences[2].line}, step 0" in _text(detail)
        await pilot.press("up", "up", "up")  # stops at the first
        assert tokens.index == 0
        await pilot.press("escape")
        assert app.screen is screen


async def test_a_file_that_cannot_be_scored_is_said_on_screen(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_ids": [1], "completion_ids": [2], "logprobs": [0.5]}\n')
    app = RolloutsApp(RolloutsJob(str(bad), Settings(model="tiny", dtype="float32")))
    async with app.run_test(size=(100, 30)) as pilot:
        status = app.screen.query_one("#rollouts-status", Static)
        await wait_for(pilot, lambda: "not scored" in _text(status), "the fault")
        assert "line 1: logprob 0 is 0.5" in _text(status) and app.is_running


def test_the_launcher_opens_the_rollouts_view_and_refuses_a_bad_setting_in_one_line(rollouts, capsys):
    app = build_app(["--rollouts", str(rollouts), "--model", "tiny", "--batch-tokens", "64"])
    assert isinstance(app, RolloutsApp) and app.job.batch_tokens == 64 and app.session_path is None
    assert build_app(["--rollouts", str(rollouts), "--model", "tiny", "--batch-tokens", "0"]) == 2
    assert "--batch-tokens must be at least 1" in capsys.readouterr().err
