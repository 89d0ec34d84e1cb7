"""`--resume DIR`: continue a recorded run with the same run id, numbering and totals.

The recorded manifest holds the run's configuration; the new command line may
change only what makes sense for the rest of the run (`--on-disk-full`, and
`--duration`, read as "this much more load"). The gap while tokentop was not
running is marked by a `resume` event in the first new Snapshot and is not
counted as load time.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from loadgen.model.snapshot import Counters
from loadgen.record.rundir import RunDirError, last_snapshot, read_manifest
from loadgen.run.config import ConfigError, RunConfig


class ResumeFrom(msgspec.Struct, kw_only=True):
    """Where a resumed run picks up: same run id, numbering and totals."""

    run_id: str
    seq: int  # the next Snapshot's seq
    elapsed: float  # seconds the run had lasted at its last Snapshot
    counters: Counters  # the totals at its last Snapshot
    # --mix: each class's totals at its last Snapshot (empty: no mix)
    class_counters: dict[str, Counters] = msgspec.field(default_factory=dict)


def resumed(given: RunConfig) -> tuple[RunConfig, ResumeFrom]:
    """The recorded config and where to pick up, with what the new command line may change."""
    assert given.resume is not None
    cfg, resume = read_resume(given.resume, duration=given.duration)
    cfg.on_disk_full = given.on_disk_full
    return cfg, resume


def read_resume(run_dir: Path | str, *,
                duration: float | None = None) -> tuple[RunConfig, ResumeFrom]:
    """(RunConfig, ResumeFrom) to continue the run in `run_dir`.

    The config is the recorded one; the resumed run does `duration` seconds more load
    when given, else what is left of the recorded duration; there is no second warm-up.
    Raises ConfigError in words.
    """
    run_dir = Path(run_dir)
    try:
        manifest = read_manifest(run_dir)
    except RunDirError as e:
        raise ConfigError(f"cannot resume: {e}") from None
    last = last_snapshot(run_dir)
    if last is None:
        raise ConfigError(f"cannot resume {run_dir}: it holds no complete snapshot")
    config = dict(manifest.get("config") or {})
    _older_sim_flags(run_dir, config)
    config = {k: v for k, v in config.items()
              if k in RunConfig.__struct_fields__ and v != "[removed]"}
    try:
        cfg = msgspec.convert(config, RunConfig)
    except msgspec.ValidationError as e:
        raise ConfigError(f"cannot resume {run_dir}: its config is not readable ({e})") from None
    if duration is not None:
        cfg.duration = duration
    elif cfg.duration is not None:
        remaining = cfg.duration + cfg.warmup - last.elapsed
        if remaining <= 0.5:
            raise ConfigError(f"cannot resume {run_dir}: the run had already done its "
                              f"--duration {cfg.duration:g} s")
        cfg.duration = remaining
    cfg.warmup = 0.0
    cfg.resume = str(run_dir)
    cfg.out = str(run_dir)
    resume = ResumeFrom(run_id=last.run_id, seq=last.seq + 1, elapsed=last.elapsed,
                        counters=last.counters,
                        class_counters={n: c.counters for n, c in last.classes.items()})
    return cfg, resume


def _older_sim_flags(run_dir: Path, config: dict) -> None:
    """Run directories recorded before the embedded simulator's settings were typed hold its
    flags in `sim_args` (now `sim`, a SimConfig): none is the default simulator; flags
    cannot be read here (the command line is their one reader), so such a run is refused
    in words."""
    flags = config.pop("sim_args", None)
    if isinstance(flags, list) and flags:
        raise ConfigError(f"cannot resume {run_dir}: its simulator flags ({' '.join(flags)}) "
                          "were recorded by an older tokentop; start a new run with them")
