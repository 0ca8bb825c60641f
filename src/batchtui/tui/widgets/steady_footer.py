"""Textual's Footer, rebuilt only when the keys it shows change.

The stock Footer unmounts and mounts every key whenever the screen publishes its bindings, and a focus
change publishes them twice (blur, then focus): each rebuild restyles every key (twice, for its `compact`
class), most of what a Tab press cost.
"""

from __future__ import annotations

from textual.widgets import Footer


class SteadyFooter(Footer):
    _shown: tuple | None = None  # what the keys were last built from

    async def recompose(self) -> None:
        shown = (self._bindings_ready, self.show_command_palette, self._bindings_shown())
        if shown == self._shown:
            return
        self._shown = shown
        await super().recompose()

    def _bindings_shown(self) -> tuple:
        """What Footer.compose builds its keys from: the bindings it shows and the command palette's, in order, with
        whether each is enabled and its tooltip (a focused widget's own hidden bindings come and go with the focus)."""
        palette = self.app.COMMAND_PALETTE_BINDING
        return tuple(
            (binding, enabled, tooltip)
            for key, (_, binding, enabled, tooltip) in self.screen.active_bindings.items()
            if binding.show or key == palette
        )
