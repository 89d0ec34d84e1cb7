"""`tokentop replay DIR`: the console, fed from a run directory (also while it is written)."""

from __future__ import annotations

from pathlib import Path

from tui.commands.args import Parser, fail


def main(argv: list[str]) -> int:
    p = Parser(prog="tokentop replay",
               description="The console, fed from a run directory (also while it is written). "
               "Keys: 1/2/3 speed ×1/×10/×100, ←/→ 30 s back/forward, p pause.")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--speed", type=float, default=1.0)
    p.add_argument("--no-follow", action="store_true",
                   help="stop at the end even if the run is still being written")
    p.add_argument("--theme")
    args = p.parse_args(argv)
    if not (args.run_dir / "manifest.json").exists() and not args.run_dir.is_dir():
        fail(f"{args.run_dir} is not a run directory")
    return _replay(args.run_dir, speed=args.speed, follow=False if args.no_follow else None,
                   theme=args.theme)


def _replay(run_dir: Path, *, speed: float, follow: bool | None, theme: str | None) -> int:
    from loadgen.record.replay import ReplaySource
    from tui.app import TokentopApp

    app = TokentopApp(ReplaySource(run_dir, speed=speed, follow=follow), theme=theme)
    app.run()
    return app.return_code or 0
