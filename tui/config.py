"""The user's console settings: `$XDG_CONFIG_HOME/tokentop/config.toml`
(default ~/.config/tokentop/config.toml).

Only what the console chooses for itself lives here (the theme, for now). It is
read with tomllib and written by hand (a few `key = "value"` lines). A broken
file is a warning on screen, never a crash, and it is not overwritten by a
read; writing replaces it atomically.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

FILE_NAME = "config.toml"


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "tokentop"


def config_path() -> Path:
    return config_dir() / FILE_NAME


def load_config(path: Path | None = None) -> tuple[dict[str, object], str | None]:
    """(settings, warning); a missing file is ({}, None)."""
    path = path or config_path()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}, None
    except OSError as e:
        return {}, f"cannot read {path}: {e.strerror or e}"
    try:
        return tomllib.loads(data.decode("utf-8", "replace")), None
    except tomllib.TOMLDecodeError as e:
        return {}, f"ignored {path}: {e}"


def _toml_str(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def save_setting(key: str, value: str, path: Path | None = None) -> str | None:
    """Set one top-level string setting, keeping the others; returns a warning or None."""
    path = path or config_path()
    settings, warning = load_config(path)
    if warning and path.exists():
        return f"{warning}; not overwriting it"
    settings[key] = value
    lines = ["# tokentop console settings (written by tokentop)"]
    for k, v in settings.items():
        if isinstance(v, str):
            lines.append(f"{k} = {_toml_str(v)}")
        elif isinstance(v, bool):
            lines.append(f"{k} = {'true' if v else 'false'}")
        elif isinstance(v, int | float):
            lines.append(f"{k} = {v}")
        # anything else (tables, lists) was not written by us: keep the file simple
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".toml.tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(path)
    except OSError as e:
        return f"cannot write {path}: {e.strerror or e}"
    return None
