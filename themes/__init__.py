"""The console's Textual themes.

Widgets never name a colour: they use theme variables ($primary, $warning,
$error, $success, $foreground-muted …), so each theme below recolours the
whole console. `tokentop-mono` is what NO_COLOR gets: greys only, meaning
carried by bold/reverse rather than hue.
"""

from __future__ import annotations

from textual.app import App
from textual.theme import Theme

DEFAULT_THEME = "tokentop-dark"
MONO_THEME = "tokentop-mono"

TOKENTOP_DARK = Theme(
    name="tokentop-dark",
    primary="#4FA3E0",
    secondary="#7A8CA3",
    accent="#F2B84B",
    warning="#F2B84B",
    error="#E5535F",
    success="#5BC07A",
    foreground="#D8DEE6",
    background="#0F1318",
    surface="#161C23",
    panel="#1F2731",
    dark=True,
)

TOKENTOP_LIGHT = Theme(
    name="tokentop-light",
    primary="#1F6FB2",
    secondary="#50606F",
    accent="#A35F00",
    warning="#A35F00",
    error="#B3261E",
    success="#1E7B3A",
    foreground="#1C232B",
    background="#F7F8FA",
    surface="#EDF0F3",
    panel="#DDE3E9",
    dark=False,
)

# For glare, projectors and weak eyes: pure colours on black, no subtle greys.
TOKENTOP_HIGH_CONTRAST = Theme(
    name="tokentop-high-contrast",
    primary="#00D7FF",
    secondary="#FFFFFF",
    accent="#FFFF00",
    warning="#FFFF00",
    error="#FF3030",
    success="#00FF5F",
    foreground="#FFFFFF",
    background="#000000",
    surface="#000000",
    panel="#202020",
    dark=True,
    luminosity_spread=0.25,
    text_alpha=1.0,
)

TOKENTOP_MONO = Theme(
    name="tokentop-mono",
    primary="#E0E0E0",
    secondary="#B0B0B0",
    accent="#FFFFFF",
    warning="#FFFFFF",
    error="#FFFFFF",
    success="#C0C0C0",
    foreground="#D0D0D0",
    background="#000000",
    surface="#101010",
    panel="#202020",
    dark=True,
)

THEMES: tuple[Theme, ...] = (
    TOKENTOP_DARK,
    TOKENTOP_LIGHT,
    TOKENTOP_HIGH_CONTRAST,
    TOKENTOP_MONO,
)
THEME_NAMES: tuple[str, ...] = tuple(t.name for t in THEMES)


def register_themes(app: App) -> None:
    """Make all four themes available to `app` (and to its command palette)."""
    for theme in THEMES:
        app.register_theme(theme)
