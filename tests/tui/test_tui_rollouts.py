"""The rollouts view (`batchtui --rollouts FILE --model M`): scored in a worker with progress, then the metrics,
both histograms and the worst sequences; enter opens a sequence's tokens at its worst, the heatmap's keys move along
them and between sequences; at 80x24 the verdict wraps whole, every metric is reachable, the worst tokens open their
sequence at them; a file that cannot be scored is said on screen and the app carries on."""

from __future__ import annotations

import json

import pytest
from helpers.rollout_files import sampled_rollouts, write_jsonl
from helpers.tui_helpers import wait_for
from textual.widgets import DataTable, Static
from textual_plotext import PlotextPlot

from batchtui.core import Settings
from batchtui.core.cli import main
from batchtui.core.rollouts.job import RolloutsJob
from batchtui.core.rollouts.saved import SavedRollouts
from batchtui.core.terminal.rollouts_text import metric_rows, rollouts_verdict
from batchtui.core.visible import shown_token
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
        worst = sequence.worst_step  # it opens at its worst token
        assert abs(sequence.tokens[worst].delta) == sequence.max_abs_diff
        assert tokens.step == worst and f"line {sequence.line}, step {worst} of 6" in _text(detail)
        await pilot.press("home", "right", "l")
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


async def test_at_80x24_the_verdict_is_whole_every_metric_reachable_and_a_worst_token_opens_at_itself(rollouts):
    app = RolloutsApp(RolloutsJob(str(rollouts), Settings(model="tiny", dtype="float32"), 40))
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        await wait_for(pilot, lambda: screen.summary is not None, "the scoring")
        summary = screen.summary
        status = screen.query_one("#rollouts-status", Static)
        assert _text(status) == rollouts_verdict(summary) and status.size.height >= 2  # wrapped, not cut
        await pilot.press("m", *["pagedown"] * 6)
        metrics = screen.query_one("#rollouts-metrics", DataTable)
        last = len(metric_rows(summary)) - 1
        assert metrics.has_focus and metrics.cursor_row == last
        assert metrics.scroll_y >= metrics.max_scroll_y > 0  # the table scrolled to its last row
        assert str(metrics.get_row_at(last)[0]) == metric_rows(summary)[-1][1]  # the value, in the first column
        await pilot.press("t")
        tokens = screen.query_one("#rollouts-worst-tokens", DataTable)
        assert tokens.has_focus and tokens.row_count == len(summary.worst_tokens)
        kept = [s.line for s in summary.worst_sequences]
        row = next(i for i, w in enumerate(summary.worst_tokens) if w.line in kept)
        worst = summary.worst_tokens[row]
        said = str(tokens.get_row_at(row)[-1])  # the lines give top1_ids: the sampler's top-1, and the trainer's word
        assert worst.token.sampler_top1 is not None and said.startswith(shown_token(worst.token.sampler_top1, 12))
        assert said.endswith("(not the trainer's)" if worst.token.top1_disagree else "(the trainer's too)")
        await pilot.press(*["down"] * row, "enter")
        opened = app.screen
        assert isinstance(opened, RolloutTokensScreen)
        assert opened.sequence.line == worst.line and opened.step == worst.token.step


async def test_a_file_that_cannot_be_scored_is_said_on_screen(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_ids": [1], "completion_ids": [2], "logprobs": [0.5]}\n')
    app = RolloutsApp(RolloutsJob(str(bad), Settings(model="tiny", dtype="float32")))
    async with app.run_test(size=(100, 30)) as pilot:
        status = app.screen.query_one("#rollouts-status", Static)
        await wait_for(pilot, lambda: "not scored" in _text(status), "the fault")
        assert "line 1: logprob 0 is 0.5" in _text(status) and app.is_running


async def test_a_records_file_opens_as_it_is_nothing_scored_nothing_written(rollouts, tmp_path):
    records, report = tmp_path / "records.jsonl", tmp_path / "report.json"
    assert main(["rollouts", str(rollouts), "--model", "tiny", "--dtype", "float32", "--records", str(records),
                 "--json", str(report), "--quiet"]) in (0, 1)  # fmt: skip
    with records.open("ab") as handle:
        handle.write(b'{"line": 9, "dige')  # a run stopped mid-line: left as it is
    before = records.read_bytes()
    app = build_app(["--rollouts", str(records)])  # no --model: the run's own names the tokenizer
    assert isinstance(app, RolloutsApp) and isinstance(app.job, SavedRollouts)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        await wait_for(pilot, lambda: screen.summary is not None, "the records")
        scored = json.loads(report.read_text())["rollouts"]
        m = screen.summary.metrics
        assert (m.sequences, m.tokens, m.max_abs_diff, m.kl, m.ratio_min) == tuple(
            scored[k] for k in ("sequences", "tokens", "max_abs_diff", "kl", "ratio_min")
        )
        worst = screen.summary.worst_sequences
        kept = [(s["line"], s["completion"]) for s in scored["worst_sequences"]]
        assert [(s.line, s.completion) for s in worst] == kept
        assert [t.token for t in worst[0].tokens] == [step["token"] for step in scored["worst_sequences"][0]["steps"]]
        assert "records of tiny · float32" in _text(screen.query_one("#rollouts-title", Static))
    assert records.read_bytes() == before  # only read


async def test_a_report_opens_as_it_is(rollouts, tmp_path):
    report = tmp_path / "report.json"
    main(["rollouts", str(rollouts), "--model", "tiny", "--dtype", "float32", "--json", str(report), "--quiet"])
    app = build_app(["--rollouts", str(report)])
    assert isinstance(app, RolloutsApp) and app.job.kind == "report"
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        await wait_for(pilot, lambda: screen.summary is not None, "the report")
        assert screen.summary.metrics.sequences == json.loads(report.read_text())["rollouts"]["sequences"] == 8
        assert "a saved report" in _text(screen.query_one("#rollouts-title", Static))
        assert screen.query_one("#rollouts-worst", DataTable).row_count == 8


async def test_a_damaged_records_file_is_said_on_screen(rollouts, tmp_path):
    records = tmp_path / "records.jsonl"
    main(["rollouts", str(rollouts), "--model", "tiny", "--dtype", "float32", "--records", str(records), "--quiet"])
    lines = records.read_text().splitlines()
    records.write_text("\n".join([lines[0], '{"line": 1, "digest": 5}', *lines[2:]]) + "\n")
    app = build_app(["--rollouts", str(records)])
    async with app.run_test(size=(80, 24)) as pilot:
        status = app.screen.query_one("#rollouts-status", Static)
        await wait_for(pilot, lambda: "not scored" in _text(status) or "not read" in _text(status), "the fault")
        assert "line 2: not a record of `batchtui rollouts`" in _text(status) and app.is_running


def test_the_launcher_opens_the_rollouts_view_and_refuses_a_bad_setting_in_one_line(rollouts, capsys):
    app = build_app(["--rollouts", str(rollouts), "--model", "tiny", "--batch-tokens", "64"])
    assert isinstance(app, RolloutsApp) and app.job.batch_tokens == 64 and app.session_path is None
    assert build_app(["--rollouts", str(rollouts), "--model", "tiny", "--batch-tokens", "0"]) == 2
    assert "--batch-tokens must be at least 1" in capsys.readouterr().err
