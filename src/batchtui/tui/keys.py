"""The explorer's keys, one table: each row of docs/app.md's key table with the bindings it documents, in the
footer's order (help first, so that it shows on a narrow screen too; quit last), and whether they act on a local
model's passes (off over a served model: its dtype, batch and kernels are the server's). The screen's bindings, the
local-only actions, the help and the palette (both list the bindings) and the docs' table all come from here;
tests/tui/test_tui_keys.py holds docs/app.md to `docs_table()`. A row without bindings documents keys bound elsewhere
(the editor's, the remedies screen's, the app's own)."""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding

from .move_keys import MOVE_BINDINGS


@dataclass(frozen=True)
class KeyRow:
    keys: str  # the docs' key cell, as docs/app.md writes it
    does: str  # the docs' words
    bindings: tuple[Binding, ...] = ()
    local: bool = False  # acts on a local model's passes: off over a server (`--url`)


KEY_ROWS = (
    KeyRow(
        "`?`, F1",
        "help",
        (Binding("question_mark,f1", "app.help", "Help", key_display="?/F1"),),
    ),
    KeyRow(
        "arrows, `h` `j` `k` `l`",
        (
            "move over token positions and texts, from any pane but the editor (in the summary ↑ ↓ pick a row, in the"
            " settings a field)"
        ),
        (*MOVE_BINDINGS[0:4],),
    ),
    KeyRow(
        "`Home` `End`, `g` `G`",
        "first / last position of the text",
        (*MOVE_BINDINGS[4:6],),
    ),
    KeyRow(
        "`PgUp` `PgDn`",
        "a screenful of positions back / on",
        (*MOVE_BINDINGS[6:8],),
    ),
    KeyRow(
        "`z`",
        "long texts: the whole text (each cell the worst of its span) / zoom to one position per cell",
        (MOVE_BINDINGS[8],),
    ),
    KeyRow(
        "Tab / shift+Tab, Escape",
        "next / previous pane; back to the heatmap",
        (
            Binding("tab", "focus_pane(1)", "Next pane", show=False),
            Binding("shift+tab", "focus_pane(-1)", "Previous pane", show=False),
            Binding("escape", "focus_heatmap", "Back to the heatmap", show=False),
        ),
    ),
    KeyRow(
        "`e` / Escape",
        "edit the texts / leave the editor (its lines shown from their starts again)",
        (Binding("e", "focus_editor", "Edit texts"),),
    ),
    KeyRow(
        "`ctrl+home` / `ctrl+end`",
        "in the editor: the start / the end of the texts (`Home` / `End`: of the line; with shift, selecting)",
    ),
    KeyRow(
        "`n` / `N`",
        "next / previous divergent position (not allclose, or a top-1 flip), across texts",
        (
            Binding("n", "next_divergent", "Next divergent"),
            Binding("N", "previous_divergent", "Prev divergent", key_display="N", show=False),
        ),
        local=True,
    ),
    KeyRow(
        "`f` / `F`",
        (
            "next / previous top-1 flip, across texts (the detail says it in words, each run's choice over the "
            "other's with the digits that tell them apart: `batched → ' is' 11.188 over ' are' 11.188 (tied)`, "
            "`single → ' are' 11.188 over ' is' 11.125`, and `near-tie` where the single run's margin is within "
            "2·max\\|Δ\\|)"
        ),
        (
            Binding("f", "next_flip", "Next flip"),
            Binding("F", "previous_flip", "Prev flip", key_display="F", show=False),
        ),
        local=True,
    ),
    KeyRow(
        "`w`",
        "the worst flip: the one with the largest max\\|Δ\\| in any text (or, with no flip, the worst position)",
        (Binding("w", "worst_flip", "Worst flip"),),
        local=True,
    ),
    KeyRow(
        "`]` / `[`",
        "next / previous text",
        (
            Binding("right_square_bracket", "move_selection(1, 0)", "Next text", key_display="]", show=False),
            Binding("left_square_bracket", "move_selection(-1, 0)", "Prev text", key_display="[", show=False),
        ),
    ),
    KeyRow(
        "`t`",
        (
            "the top-k chart of the selected position in the layers' place (on short screens, in the one slot); `t` "
            "again puts back what it covered"
        ),
        (Binding("t", "toggle_topk", "Top-k chart"),),
        local=True,
    ),
    KeyRow(
        "`c`",
        (
            "generation view: for every text, whether and where greedy decoding batched and alone part "
            "([cli.md](cli.md#batchtui-generate-does-batching-change-the-answer-and-from-which-token)), and under it "
            "how the tokens' arrival moves the logits: decode vs prefill, trainer vs sampler "
            "([served.md](served.md#locally-batchtui-generate---vs-prefill---vs-trainer))"
        ),
        (Binding("c", "app.toggle_generation", "Continuations"),),
        local=True,
    ),
    KeyRow(
        "`r`",
        "re-run now",
        (Binding("r", "app.rerun", "Re-run"),),
    ),
    KeyRow(
        "`d`, `p`, `b`",
        "cycle dtype, toggle padding side, cycle batch size",
        (
            Binding("d", "cycle_dtype", "dtype"),
            Binding("p", "toggle_padding", "Padding side"),
            Binding("b", "cycle_batch_size", "Batch size"),
        ),
        local=True,
    ),
    KeyRow(
        "`o`, `a`",
        "toggle positions (`mask`/`arange`), cycle attention (default, sdpa, eager)",
        (
            Binding("o", "toggle_positions", "Positions", show=False),
            Binding("a", "cycle_attention", "Attention", show=False),
        ),
        local=True,
    ),
    KeyRow(
        "`i`",
        "the batch-invariant mode on / off (also a checkbox in the settings): the heatmap then shows what it leaves",
        (Binding("i", "toggle_invariant", "Invariant mode", show=False),),
        local=True,
    ),
    KeyRow(
        "`L`",
        (
            "on short screens, the detail or the layers in the one slot (from the top-k chart: the detail); on tall "
            "ones both are in view (said)"
        ),
        (Binding("L", "toggle_layers", "Detail/layers", key_display="L", show=False),),
        local=True,
    ),
    KeyRow(
        "`s`",
        "sort the summary: the texts' order, or worst first by max\\|Δ\\|, flips or KL (a row selects its text)",
        (Binding("s", "app.cycle_summary_order", "Sort summary", show=False),),
        local=True,
    ),
    KeyRow(
        "`m`",
        (
            "layers pane: per layer or per module, each module drawn as a letter (`a` attention, `m` MLP, `n` norm, "
            "`r` router, `L` layer output; legend under the chart); in the module view the detail pane also names "
            "each divergent text's first op (`text first parts at aten.linear in ...q_proj: a 1-row call alone, 150 "
            "rows batched: ...`)"
        ),
        (Binding("m", "app.toggle_module_view", "Layers/modules"),),
        local=True,
    ),
    KeyRow(
        "`M`",
        (
            "switch the model: a hub id or a local folder, loaded first; one that fails is said in one line (no such "
            "folder, no config.json, not a hub id, not cached and the hub unreachable) and the model in use stays, in"
            " the session too"
        ),
        (Binding("M", "app.switch_model", "Model…", key_display="M", show=False),),
        local=True,
    ),
    KeyRow(
        "`ctrl+o`",
        "load texts from a file, one per line (blank lines keep the numbering; `ctrl+z` in the editor undoes it)",
        (Binding("ctrl+o", "open_texts", "Open texts file…", show=False),),
    ),
    KeyRow(
        "`R`",
        "remedies screen: pick toggles, measure before/after on the current texts",
        (Binding("R", "app.remedies", "Remedies", key_display="R"),),
        local=True,
    ),
    KeyRow(
        "`k` (on the remedies screen)",
        (
            "which of the invariant mode's classes (matmul, reduction, attention, elementwise) the difference comes "
            "from: each alone, all but each, and the smallest set that makes every text bitwise, with its cost "
            "([explain.md](explain.md#which-kernel-check---explain-kernels))"
        ),
    ),
    KeyRow(
        "`S`",
        (
            "sweep screen: dtype x batch size, max\\|Δ\\| against batch size (log2 axis) per dtype, each point its "
            "dtype's letter; the dtypes and batch sizes are set on the screen (Tab between them) and enter runs the "
            "grid, with progress, then one line that sums it up"
        ),
        (Binding("S", "app.sweep", "Sweep", key_display="S"),),
        local=True,
    ),
    KeyRow(
        "`ctrl+s`",
        (
            "save a JSON report (a name ending in `.json`) or a repro pack (any other name: a new folder; the texts "
            "run again to keep their logits): the comparison and the generation, sweep and remedies run on the texts "
            "and settings on screen; asks where (a fresh `batchtui-report-<time>.json` in the output folder offered),"
            " never overwrites a file, says where it went"
        ),
        (Binding("ctrl+s", "app.save_report", "Save report"),),
    ),
    KeyRow(
        "`I`",
        (
            "the environment's fingerprint, whole in a notification and in the status line where it fits: torch and "
            "transformers versions, CPU capability, threads, GPUs, TF32 "
            "([cli.md](cli.md#reports-that-travel---repro-check---from-batchtui-diff))"
        ),
        (Binding("I", "app.show_environment", "Fingerprint", key_display="I", show=False),),
    ),
    KeyRow(
        "`f8`",
        "save an SVG screenshot",
    ),
    KeyRow(
        "`q`, `ctrl+c`",
        "quit, session saved (`q` types a q while in the editor)",
        (Binding("q", "app.quit", "Quit"),),
    ),
)
EXPLORER_BINDINGS = [binding for row in KEY_ROWS for binding in row.bindings]
# The actions a served model has no use for (their names as a screen or the app checks them).
LOCAL_ONLY_ACTIONS = frozenset(
    binding.action.removeprefix("app.").split("(")[0] for row in KEY_ROWS if row.local for binding in row.bindings
)
# Tab and shift+Tab: over the panes in view (the help lists them with the moves, in words).
FOCUS_BINDINGS = [binding for binding in EXPLORER_BINDINGS if binding.action.startswith("focus_pane")]


def docs_table() -> str:
    """docs/app.md's key table, as the rows say it."""
    lines = ["| key | does |", "|---|---|", *(f"| {row.keys} | {row.does} |" for row in KEY_ROWS)]
    return "\n".join(lines) + "\n"
