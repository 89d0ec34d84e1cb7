"""The `?` screen: every key the console answers to, taken from the app's own bindings."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Static


def help_text(bindings: list[BindingType]) -> Content:
    # Content, not markup: the keys themselves are "[" and "]"
    lines = []
    # every key with a tooltip, including those the footer leaves out for room
    shown = [b for b in bindings if isinstance(b, Binding) and (b.tooltip or b.show)]
    width = max((len(b.key_display or b.key) for b in shown), default=5)
    for b in shown:
        key = (b.key_display or b.key).rjust(width)
        lines.append(Content.assemble((key, "bold $accent"), "  ", b.tooltip or b.description))
    return Content("\n").join(lines)


# what the colours mean; every one of them is also said in words or a mark on screen
COLOURS = (
    ("$success", "green", "SLO met (the SLO line says PASS, \"ok\")"),
    ("$error", "red", "SLO breached (\"!\" in a cell, FAIL), errors, outage"),
    ("$warning", "yellow", "worth a look: backlog, warm-up, throttling, heat"),
    ("$accent", "accent", "what you set: the target load, operator notes"),
    ("$foreground-muted", "dim", "labels and units"),
)


def colour_text() -> Content:
    lines = [Content.assemble(("colours", "bold"))]
    for style, name, meaning in COLOURS:
        lines.append(Content.assemble((name.rjust(7), f"bold {style}"), "  ", meaning))
    return Content("\n").join(lines)


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen {
        align: center middle;
    }
    HelpScreen > VerticalScroll {
        width: 84;
        max-width: 95%;
        height: auto;
        max-height: 90%;
        padding: 0 2;
        border: round $primary;
        border-title-color: $primary;
        background: $surface;
    }
    HelpScreen Static {
        width: 100%;
    }
    HelpScreen #help-foot {
        color: $foreground-muted;
        margin-top: 1;
    }
    HelpScreen #help-colours {
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
        # scrolls: at 80x24 the keys alone are taller than the screen
        with VerticalScroll(id="help-scroll") as box:
            box.border_title = "tokentop keys"
            box.border_subtitle = "↑↓ pgup pgdn scroll"
            yield Static(help_text(self._keys), id="help-keys")
            yield Static(colour_text(), id="help-colours")
            yield Static(
                "ctrl+p  command palette (every key above, and Textual's own)\n"
                "escape  close this help; escape also leaves a detail screen", id="help-foot"
            )

    def on_mount(self) -> None:
        # focused, so the arrow and page keys scroll it
        self.query_one("#help-scroll").focus()

    def action_close(self) -> None:
        self.dismiss(None)
