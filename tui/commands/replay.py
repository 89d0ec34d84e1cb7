"""`tokentop replay DIR`: the console, fed from a run directory (also while it is written)."""

from __future__ import annotations

from pathlib import Path

from tui.commands.args import Parser, fail, positive


def main(argv: list[str]) -> int:
    p = Parser(prog="tokentop replay",
               description="The console, fed from a run directory (also while it is written). "
               "Keys: 1/2/3 speed ×1/×10/×100, ←/→ 30 s back/forward, p pause the replay. "
               "At the end it waits there (← seeks back).")
    p.add_argument("run_dir", type=Path, help="the run directory to play (a run's --out)")
    p.add_argument("--speed", type=_speed, default=1.0,
                   help="play the recording this many times faster; 0: as fast as it reads "
                   "(default 1)")
    p.add_argument("--no-follow", action="store_true",
                   help="stop at the end even if the run is still being written")
    p.add_argument("--slo", help="judge the recording by these SLOs (as `tokentop run --slo`): "
                   "their breaches and recoveries replace the recorded ones; default: the "
                   "run's own --slo, as recorded")
    p.add_argument("--theme", help="tokentop-dark (default), tokentop-light, "
                   "tokentop-high-contrast, tokentop-mono; `t` cycles them")
    args = p.parse_args(argv)
    _check(args.run_dir)
    return _replay(args.run_dir, speed=args.speed, follow=False if args.no_follow else None,
                   slo=args.slo, theme=args.theme)


def _speed(text: str) -> float:
    return positive(text, zero=True)  # 0: as fast as the recording reads


def _check(run_dir: Path) -> None:
    """Nothing to show (not a directory, not a run directory, no Snapshot yet): one line and
    exit 2 before the console starts, as `tokentop report` does, not a console with an
    error that then exits 0."""
    from loadgen.model.source import SourceError
    from loadgen.record.replay import check_replayable

    try:
        check_replayable(run_dir)
    except SourceError as e:
        fail(str(e), prog="tokentop replay")


def _replay(run_dir: Path, *, speed: float, follow: bool | None, slo: str | None,
            theme: str | None) -> int:
    from tui.app import TokentopApp

    source, shown_slo = replay_source(run_dir, speed=speed, follow=follow, slo=slo)
    app = TokentopApp(source, theme=theme, slo=shown_slo, mix=recorded_mix(run_dir))
    app.run()
    return app.return_code or 0


def replay_source(run_dir: Path, *, speed: float = 1.0, follow: bool | None = None,
                  slo: str | None = None, hold: bool = True):
    """The source `tokentop replay` shows, and the SLOs its colours judge by: with --slo, the
    recording judged afresh by a Watch; without, as recorded. `hold`: the console's (it
    stays at the end); a reader that wants the recording through to its end passes False."""
    from loadgen.model.slo import SloError, parse_slos
    from loadgen.record.replay import ReplaySource
    from loadgen.run.watch import WatchedSource

    # held at the end: the console stays on the recording, and ← still seeks back from there
    source = ReplaySource(run_dir, speed=speed, follow=follow, hold=hold)
    if slo is None:
        slo = _recorded(run_dir, "slo")
        return source, slo if isinstance(slo, str) else None
    try:
        return WatchedSource(source, parse_slos(slo)), slo
    except SloError as e:
        fail(str(e), prog="tokentop replay")


def recorded_mix(run_dir: Path) -> list[str] | None:
    """The run's own --mix, for its classes' lines in the console (None: none recorded)."""
    mix = _recorded(run_dir, "mix")
    return [str(m) for m in mix] if isinstance(mix, list) else None


def _recorded(run_dir: Path, key: str):
    """A key of the run's own config (its --slo, its --mix), for the console's colours (its
    events are in the recording); None where the recording has none."""
    from loadgen.record.rundir import RunDirError, read_manifest

    try:
        return (read_manifest(run_dir).get("config") or {}).get(key)
    except RunDirError:
        return None  # replay itself says what is wrong with the directory
