"""The explorer's state: what it runs on, what it shows, and which run is current. The app is its one writer
(its key handlers and message handlers call the methods below); the panes are handed what they draw from it."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.endpoint.result import EndpointComparison
from ..core.numbers.comparison import Comparison
from ..core.numbers.generation_result import GenerationComparison
from ..core.settings import Settings
from ..core.texts import NumberedTexts
from .views.status import RunStatus

# What the remedies and the sweep ran on: the texts and the settings.
RunKey = tuple[tuple[str, ...], Settings]


@dataclass
class ExplorerState:
    settings: Settings
    # The texts, as the editor holds them (taken at every edit and before every save): its buffer, every line as
    # the text it stands for (what a session keeps), the non-blank ones numbered, and how many lines were blank.
    editor_text: str = ""
    texts_source: str = ""
    texts: NumberedTexts = field(default_factory=lambda: NumberedTexts([], []))
    blank_lines: int = 0
    comparison: Comparison | None = None  # the latest comparison on screen
    selected: tuple[int, int] = (0, 0)  # (text, position) of the cell in view
    module_view: bool = False  # the layers pane shows per-module divergence
    summary_order: str = "text"  # or worst first by one of SUMMARY_ORDERS
    generation_view: bool = False  # `c`: the continuations cover the heatmap
    run_number: int = 0  # of the latest run started; a message of an older run is stale
    settled_run: int = 0  # of the latest run whose result or error is on screen
    run_text: str | None = None  # the editor's text when the latest run started
    run_texts: NumberedTexts | None = None  # ... its texts and settings, which the generation view runs on
    run_settings: Settings | None = None
    # The generation of a run's texts, as (run number, result): shown only while that run is the latest.
    generated: tuple[int, GenerationComparison | EndpointComparison] | None = None
    status: RunStatus = field(default_factory=RunStatus)  # what the status line says of the runs
    _last_sweep: tuple[RunKey, tuple] | None = field(default=None, repr=False)  # (dtypes, sizes, cells)
    _last_remedies: tuple[RunKey, list] | None = field(default=None, repr=False)

    def take_texts(self, editor_text: str, source: str, texts: NumberedTexts, blank_lines: int) -> None:
        self.editor_text, self.texts_source, self.texts, self.blank_lines = editor_text, source, texts, blank_lines

    def start_run(self) -> int:
        """A new run of the texts with the settings now in use; returns its number (older runs turn stale)."""
        self.run_text = self.editor_text
        self.run_texts, self.run_settings = self.texts, self.settings
        self.run_number += 1
        return self.run_number

    def is_current(self, run: int) -> bool:
        return run == self.run_number

    def settle(self, run: int, comparison: Comparison | None = None) -> None:
        """The run's result (or, with None, its error) is on screen."""
        self.settled_run = run
        if comparison is not None:
            self.comparison = comparison

    def keep_generation(self, run: int, result: GenerationComparison | EndpointComparison) -> None:
        self.generated = (run, result)

    @property
    def generation_on_screen(self) -> GenerationComparison | EndpointComparison | None:
        """The generation of the latest run's texts (or a served model's continuations), once it is there."""
        if self.generated is not None and self.generated[0] == self.run_number:
            return self.generated[1]
        return None

    def keep_sweep(self, key: RunKey, finished: tuple) -> None:
        self._last_sweep = (key, finished)

    def sweep_for(self, key: RunKey) -> tuple | None:
        """The last sweep's (dtypes, batch sizes, cells), if it was of these texts and settings."""
        return self._last_sweep[1] if self._last_sweep and self._last_sweep[0] == key else None

    def keep_remedies(self, key: RunKey, outcomes: list) -> None:
        self._last_remedies = (key, outcomes)

    def remedies_for(self, key: RunKey) -> list | None:
        """The last remedies measured, if of these texts and settings."""
        return self._last_remedies[1] if self._last_remedies and self._last_remedies[0] == key else None
