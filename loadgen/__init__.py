"""Drive load at an OpenAI-compatible server and measure it (see DESIGN.md)."""

__version__ = "0.1.0"
