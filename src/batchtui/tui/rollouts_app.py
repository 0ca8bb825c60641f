"""`batchtui --rollouts FILE.jsonl --model M`: the app on the rollouts view alone (no texts, no session)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from textual.app import App
from textual.binding import Binding

from ..core.visible import literal_lines
from .daemon_executor import DaemonThreadExecutor
from .outputs import write_screenshot
from .screens.rollouts_screen import RolloutsScreen


class RolloutsApp(App[None]):
    CSS_PATH = "rollouts.tcss"
    TITLE = "batchtui rollouts"
    BINDINGS = [
        Binding("f8", "screenshot", "Screenshot", show=False),
        Binding("q", "quit", "Quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
    ]

    def __init__(self, job, output_dir: Path | None = None) -> None:
        super().__init__()
        self.job = job  # a `RolloutsJob`
        self.output_dir = output_dir or Path.cwd()
        self.session_path = None  # nothing to save: the records file (`batchtui rollouts --records`) keeps work

    def notify(self, message: str, *, markup: bool = False, **kwargs) -> None:
        super().notify(literal_lines(message), markup=markup, **kwargs)

    def get_default_screen(self) -> RolloutsScreen:
        return RolloutsScreen(self.job)

    def on_mount(self) -> None:
        # The scoring runs on a daemon thread: quitting mid-batch does not wait for the batch to end.
        asyncio.get_running_loop().set_default_executor(DaemonThreadExecutor())

    def action_screenshot(self) -> None:
        written, said = write_screenshot(self.output_dir, self.export_screenshot())
        self.notify(said, severity="information" if written else "error")
