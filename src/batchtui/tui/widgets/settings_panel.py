"""The settings a user changes live; the model and device are fixed on the command line."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid
from textual.markup import escape
from textual.message import Message
from textual.widgets import Checkbox, Input, Label, Select

from ...core.errors import InputError
from ...core.settings import DTYPES, PADDING_SIDES, POSITION_MODES, SHORT_DTYPES, Settings
from ...core.visible import literal

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
# The attention choices `a` cycles through: the model's default, then the two every model has.
ATTENTION_CHOICES = (None, "sdpa", "eager")
# What `auto` resolved to, short enough for the select's width at 80 columns.
TOP_KS = (1, 3, 5, 10, 20)
ATTN_IMPLEMENTATIONS = ("default", "sdpa", "eager")
# On/off settings: (field, label). `invariant` keeps the batch-invariant mode on while exploring.
CHECKBOXES = (("decompose", "batch vs pad"), ("reference", "vs float64"), ("invariant", "invariant"))


def next_in(values, current):
    values = list(values)
    return values[(values.index(current) + 1) % len(values)] if current in values else values[0]


def _options(values, current) -> list[tuple[str, object]]:
    values = list(values)
    if current not in values:
        values.append(current)
    return [(str(value), value) for value in values]


class OnOffCheckbox(Checkbox):
    """A checkbox whose mark says on or off (✓ or blank), not only its colour."""

    @property
    def BUTTON_INNER(self) -> str:  # noqa: N802 - the name ToggleButton reads
        return "✓" if self.value else " "


class SettingSelect(Select, inherit_bindings=False):
    """A select that opens on enter or space; up and down move between the panel's fields."""

    BINDINGS = [Binding("enter,space", "show_overlay", "Show menu", show=False)]


class SettingsPanel(Grid):
    """A compact grid of labelled selects; posts `Changed` with the new Settings.

    One stop on the app's Tab cycle: up and down move between its fields, enter opens a select or
    toggles a box, Escape goes back to the heatmap."""

    DEFAULT_CSS = """
    SettingsPanel Label {
        color: $text-muted;
    }

    SettingsPanel Select, SettingsPanel Input {
        width: 1fr;
    }

    SettingsPanel Checkbox {
        column-span: 2;
    }

    /* An open menu covers the fields under it: it must not read as one of them (a framed, lighter panel; the
       frame over the compact option list's own `border: none !important`). */
    SettingsPanel Select > SelectOverlay {
        background: $panel-lighten-2;
    }

    SettingsPanel Select > SelectOverlay.-textual-compact {
        border: round $accent !important;
    }

    /* The focused setting stands out by more than a shade. */
    SettingsPanel Select:focus > SelectCurrent, SettingsPanel Input:focus, SettingsPanel Checkbox:focus {
        background: $accent 45%;
        text-style: bold;
    }
    """

    BINDINGS = [
        Binding("up", "step_field(-1)", "Previous setting", show=False),
        Binding("down", "step_field(1)", "Next setting", show=False),
    ]

    class Changed(Message):
        def __init__(self, settings: Settings) -> None:
            super().__init__()
            self.settings = settings

    def __init__(self, settings: Settings, **kwargs) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        self._last_field = None
        self.show_model(settings.model, settings.device)

    def show_model(self, model: str, device: str) -> None:
        self.border_title = f"model {escape(literal(model, 40))} · device {escape(device)}"

    def compose(self) -> ComposeResult:
        s = self.settings
        yield from self._select("dtype", "dtype", DTYPES, s.dtype)
        yield from self._select("batch", "batch_size", BATCH_SIZES, s.batch_size)
        yield from self._select("pad", "padding_side", PADDING_SIDES, s.padding_side)
        yield from self._select("pos", "positions", POSITION_MODES, s.positions)
        yield from self._select("attn", "attn", ATTN_IMPLEMENTATIONS, s.attn or "default")
        yield from self._select("top-k", "top_k", TOP_KS, s.top_k)
        for field in ("atol", "rtol"):
            yield Label(field)
            yield Input(f"{getattr(s, field):g}", id=field, compact=True)
        for field, label in CHECKBOXES:  # each takes a label's column and a field's: never cut
            yield OnOffCheckbox(label, getattr(s, field), id=field, compact=True)

    @staticmethod
    def _select(label: str, field: str, values, current) -> ComposeResult:
        yield Label(label)
        yield SettingSelect(_options(values, current), value=current, id=field, allow_blank=False, compact=True)

    def _fields(self) -> list:
        return [widget for widget in self.children if widget.focusable]

    def focus_field(self) -> None:
        """The field focused last (the first one at first)."""
        fields = self._fields()
        (self._last_field if self._last_field in fields else fields[0]).focus()

    def action_step_field(self, step: int) -> None:
        fields = self._fields()
        here = fields.index(self.app.focused) if self.app.focused in fields else -1
        fields[(here + step) % len(fields)].focus()

    def on_descendant_focus(self, event) -> None:
        self._last_field = event.widget

    def show_resolved_dtype(self, resolved: str | None) -> None:
        """`auto` in the dtype list says what it resolved to (None: not resolved, or not auto)."""
        select = self.query_one("#dtype", Select)
        label = f"auto ({SHORT_DTYPES.get(resolved, resolved)})" if resolved and resolved != "auto" else "auto"
        options = [(label if value == "auto" else name, value) for name, value in _options(DTYPES, self.settings.dtype)]
        if str(select.query_one("SelectCurrent").label) == label or select.value != "auto":
            return
        with self.prevent(Select.Changed):
            select.set_options(options)
            select.value = "float32"  # an unchanged value would keep the old label on the select
            select.value = "auto"

    def show(self, settings: Settings) -> None:
        """Reflect settings changed elsewhere (keys d, p, b) without re-posting them."""
        self.settings = settings
        with self.prevent(Select.Changed, Input.Changed):
            for field in ("dtype", "batch_size", "padding_side", "positions", "top_k"):
                self.query_one(f"#{field}", Select).value = getattr(settings, field)
            self.query_one("#attn", Select).value = settings.attn or "default"
        with self.prevent(Checkbox.Changed):
            for field, _ in CHECKBOXES:
                self.query_one(f"#{field}", Checkbox).value = getattr(settings, field)

    def on_select_changed(self, event: Select.Changed) -> None:
        event.stop()
        if event.value is Select.NULL or event.select.id is None:
            return
        value = None if event.select.id == "attn" and event.value == "default" else event.value
        self._post(**{event.select.id: value})

    def on_checkbox_changed(self, event: Checkbox.Changed) -> None:
        event.stop()
        self._post(**{event.checkbox.id: event.value})

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._post_tolerance(event.input)

    def on_input_blurred(self, event: Input.Blurred) -> None:
        self._post_tolerance(event.input)

    def _post_tolerance(self, field: Input) -> None:
        try:
            value = float(field.value)
            self.settings.with_changes(**{field.id: value}).validated()  # nan, inf and negatives are refused
        except (ValueError, InputError) as exc:
            reason = exc if isinstance(exc, InputError) else f"{field.id} must be a number, not {field.value!r}"
            self.app.notify(str(reason), severity="error", markup=False)
            with self.prevent(Input.Changed):
                field.value = f"{getattr(self.settings, field.id):g}"  # the value still in use
            return
        self._post(**{field.id: value})

    def cycle(self, field: str, values) -> None:
        """The setting's next value among `values` (a key's doing: d, p, b, o, a, i), posted as a change."""
        self._post(**{field: next_in(values, getattr(self.settings, field))})

    def _post(self, **change) -> None:
        settings = self.settings.with_changes(**change)
        if settings != self.settings:
            self.settings = settings
            self.post_message(self.Changed(settings))
