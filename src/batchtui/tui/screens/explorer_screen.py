"""The explorer: the texts and settings on the left, the heatmap and what it selects on the right, the status line
under them. Its keys work from every pane but the editor (which types them), and only while it is on top: over
the remedies, sweep or help screen they do nothing, without a check of ours.

It owns its panes' layout and focus; keys that act on one pane go to that pane's widget (moves and jumps to the
heatmap, setting keys to the settings panel, a texts file to the editor); keys that change what the app holds
are the app's actions. What the panes draw comes down from the app's `ExplorerState` through the `show_*`
methods below."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen

from ...core.numbers.comparison import Comparison
from ...core.settings import DTYPES, PADDING_SIDES, POSITION_MODES, Settings
from ..explorer_state import ExplorerState
from ..keys import EXPLORER_BINDINGS, FOCUS_BINDINGS, LOCAL_ONLY_ACTIONS
from ..move_keys import MOVE_BINDINGS
from ..views.navigation import next_divergent, next_flip
from ..widgets.detail import DetailPane
from ..widgets.generation_pane import GenerationPane
from ..widgets.heatmap import NO_DIVERGENT, NO_FLIP, Heatmap
from ..widgets.layers import LayersPane
from ..widgets.settings_panel import ATTENTION_CHOICES, BATCH_SIZES, SettingsPanel
from ..widgets.status_line import StatusLine
from ..widgets.steady_footer import SteadyFooter
from ..widgets.summary_table import SummaryTable
from ..widgets.texts_editor import TextsEditor
from ..widgets.topk_pane import TopkPane
from .prompt_screen import PromptScreen


class ExplorerScreen(Screen[None]):
    class Ready(Message):
        """Its panes are mounted: the app may show what it holds and start the first run."""

    class CloseGeneration(Message):
        """Escape over the generation view: the app holds which view is open."""

    BINDINGS = EXPLORER_BINDINGS  # (tui/keys.py: the one table of the explorer's keys)

    def __init__(self, texts: list[str], settings: Settings, served: bool) -> None:
        super().__init__()
        self._texts = texts
        self._settings = settings
        self.served = served  # `--url`: only the generation view is in view, the local panes are hidden
        self._layers_before_topk = False  # on a short screen, whether `t` covered the layers or the detail

    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            with Vertical(id="left"):
                yield TextsEditor(self._texts, id="editor")
                yield SettingsPanel(self._settings, id="settings")
                yield SummaryTable(id="summary")
            with Vertical(id="right"):
                yield Heatmap(id="heatmap")
                yield DetailPane(id="detail")
                yield LayersPane(id="layers")
                yield TopkPane(id="topk")
                yield GenerationPane(id="generation")
        yield StatusLine(id="status")
        yield SteadyFooter()

    def on_mount(self) -> None:
        if self.served:
            self.add_class("-generation", "-endpoint")
        self.post_message(self.Ready())

    def check_action(self, action: str, parameters) -> bool | None:
        return not (self.served and action in LOCAL_ONLY_ACTIONS)

    def keys_listed(self, app_bindings: list[Binding]) -> list[Binding]:
        """The keys the help and the palette list, in the footer's order: this screen's (but the moves and Tab,
        which the help says in words), then the app's others; over a server, none of the local passes'."""
        own = [b for b in self.BINDINGS if b not in MOVE_BINDINGS and b not in FOCUS_BINDINGS]
        shown = {b.key for b in own}
        listed = [*own, *(b for b in app_bindings if b.key not in shown)]
        return [b for b in listed if self.check_action(b.action.removeprefix("app.").split("(")[0], ()) is not False]

    @property
    def status(self) -> StatusLine:
        return self.query_one(StatusLine)

    @property
    def editor(self) -> TextsEditor:
        return self.query_one(TextsEditor)

    # -- focus and layout ----------------------------------------------------------------

    def action_focus_editor(self) -> None:
        self.editor.focus()

    def action_focus_heatmap(self) -> None:
        """Escape, from anywhere: back to the heatmap (closing the generation view, which covers it); over a
        served model (`--url`), back to the generation view, which is all there is."""
        if self.served:
            self.query_one(GenerationPane).focus_table()
        elif self.has_class("-generation"):
            self.post_message(self.CloseGeneration())
        else:
            self.query_one(Heatmap).focus()

    def on_texts_editor_left(self) -> None:
        self.action_focus_heatmap()

    def action_focus_pane(self, step: int) -> None:
        """Tab / shift+Tab: the next pane in view of heatmap (or generation table), detail, summary and settings.
        The editor is not on the cycle: `e` enters it and Escape leaves, so typing never runs a command."""
        generation = self.has_class("-generation")
        detail = self.query_one(DetailPane)
        panes = [
            self.query_one(GenerationPane).table if generation else self.query_one(Heatmap),
            *([] if generation or not detail.display else [detail]),
            self.query_one(SummaryTable),
            self.query_one(SettingsPanel),
        ]
        if self.served:  # the summary and the settings are of local runs: hidden
            panes = panes[:1]
        focused = self.focused
        here = next((i for i, pane in enumerate(panes) if focused and pane in focused.ancestors_with_self), -1)
        target = panes[(here + step) % len(panes)]
        if isinstance(target, SettingsPanel):
            target.focus_field()
        else:
            target.focus()

    def action_toggle_layers(self) -> None:
        """On a short screen, the detail or the layers (from the top-k chart: the detail); on a tall one both are
        in view, and it says so."""
        if not self.has_class("-short"):
            self.notify("the detail and the layers are both in view at this size: L swaps them on short screens")
            return
        if self.has_class("-topk"):
            self.remove_class("-topk", "-layers")
        else:
            self.toggle_class("-layers")

    def action_toggle_topk(self) -> None:
        """The top-k chart in view, in the layers' place (on a short screen, in the one slot); pressed again, what
        was there before comes back."""
        if self.has_class("-topk"):
            self.remove_class("-topk")
            self.set_class(self._layers_before_topk, "-layers")
        else:
            self._layers_before_topk = self.has_class("-layers")
            self.add_class("-layers", "-topk")

    # -- keys handed to the pane they act on ---------------------------------------------

    def action_move_selection(self, texts: int, positions: int) -> None:
        self.query_one(Heatmap).action_move(texts, positions)

    def action_page_selection(self, pages: int) -> None:
        self.query_one(Heatmap).action_page(pages)

    def action_zoom(self) -> None:
        self.query_one(Heatmap).action_zoom()

    def action_next_divergent(self, forward: bool = True) -> None:
        self.query_one(Heatmap).jump(next_divergent, forward, NO_DIVERGENT)

    def action_previous_divergent(self) -> None:
        self.action_next_divergent(forward=False)

    def action_next_flip(self, forward: bool = True) -> None:
        self.query_one(Heatmap).jump(next_flip, forward, NO_FLIP)

    def action_previous_flip(self) -> None:
        self.action_next_flip(forward=False)

    def action_worst_flip(self) -> None:
        self.query_one(Heatmap).jump_to_worst_flip()

    def action_cycle_dtype(self) -> None:
        self.query_one(SettingsPanel).cycle("dtype", DTYPES)

    def action_toggle_padding(self) -> None:
        self.query_one(SettingsPanel).cycle("padding_side", PADDING_SIDES)

    def action_cycle_batch_size(self) -> None:
        self.query_one(SettingsPanel).cycle("batch_size", BATCH_SIZES)

    def action_toggle_positions(self) -> None:
        self.query_one(SettingsPanel).cycle("positions", POSITION_MODES)

    def action_cycle_attention(self) -> None:
        self.query_one(SettingsPanel).cycle("attn", ATTENTION_CHOICES)

    def action_toggle_invariant(self) -> None:
        """The batch-invariant mode on or off: with it on, the heatmap shows what it leaves."""
        self.query_one(SettingsPanel).cycle("invariant", (False, True))

    def action_open_texts(self) -> None:
        """ctrl+o: the editor's texts replaced by a file's lines, the file asked for first."""
        prompt = PromptScreen("texts file (one text per line)", "", "a path · ")
        self.app.push_screen(prompt, self.editor.load_file)

    # -- what the panes draw, handed down from the app's state ---------------------------

    def show_selection(self, state: ExplorerState) -> None:
        comparison, selected = state.comparison, state.selected
        self.query_one(Heatmap).show(comparison, selected)
        self.query_one(DetailPane).show(comparison, selected)
        self.query_one(LayersPane).show(comparison, selected[0], state.module_view)
        self.query_one(TopkPane).show(comparison, selected)
        self.query_one(SummaryTable).select_text(selected[0])
        self.show_generation(state)

    def show_summary(self, comparison: Comparison, state: ExplorerState) -> None:
        self.query_one(SummaryTable).show(comparison, state.selected[0], state.summary_order)

    def show_generation(self, state: ExplorerState) -> None:
        """The selected text's generation, when the view is open and the generation is of these texts."""
        if state.generation_view and state.generation_on_screen is not None:
            self.query_one(GenerationPane).show(state.generation_on_screen, state.selected[0])

    def show_generation_view(self, state: ExplorerState) -> None:
        """The generation view opened or closed as the state says; focus goes with it."""
        self.set_class(state.generation_view, "-generation")
        if not state.generation_view:
            self.query_one(Heatmap).focus()
            return
        self.query_one(GenerationPane).focus_table()
        self.show_generation(state)

    def wait_for_generation(self, state: str) -> None:
        self.query_one(GenerationPane).waiting(state)

    def show_setup(self, settings: Settings, dtype: str, device: str) -> None:
        """The model, device and the dtype `auto` resolved to (once a run loaded the model) in the settings' title."""
        panel = self.query_one(SettingsPanel)
        panel.show_model(settings.model, device)
        panel.show_resolved_dtype(dtype if settings.dtype == "auto" else None)

    def show_settings(self, settings: Settings) -> None:
        self.query_one(SettingsPanel).show(settings)
