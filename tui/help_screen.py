"""The `?` screen: every key the console answers to, taken from the app's own bindings."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Static


def help_text(bindings: list[BindingType]) -> Content:
    # Content, not markup: the keys themselves are "[" and "]"
    lines = []
    for b in bindings:
        # every key with a tooltip, including those the footer leaves out for room
        if not isinstance(b, Binding) or not (b.tooltip or b.show):
            continue
        key = (b.key_display or b.key).rjust(5)
        lines.append(Content.assemble((key, "bold $accent"), "  ", b.tooltip or b.description))
    return Content("\n").join(lines)


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen {
        align: center middle;
    }
    HelpScreen > Vertical {
        width: auto;
        max-width: 90%;
        height: auto;
        max-height: 90%;
        padding: 0 2;
        border: round $primary;
        border-title-color: $primary;
        background: $surface;
    }
    HelpScreen Static {
        width: auto;
    }
    HelpScreen #help-foot {
        color: $foreground-muted;
        margin-top: 1;
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Close"),
        Binding("question_mark", "close", "Close", show=False),
        Binding("q", "close", "Close", show=False),
    ]

    def __init__(self, bindings: list[BindingType]) -> None:
        super().__init__()
        self._keys = bindings

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "tokentop keys"
            yield Static(help_text(self._keys), id="help-keys")
            yield Static(
                "ctrl+p  command palette (every key above, and Textual's own)\n"
                "escape  close this help; escape also leaves a detail screen", id="help-foot"
            )

    def action_close(self) -> None:
        self.dismiss(None)
