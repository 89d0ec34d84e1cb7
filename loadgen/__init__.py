"""Drive load at an OpenAI-compatible server and measure it.

The packages, and what each may import (README, "How it is built"; the rule is
tests/test_layout.py):

    model/     the shared vocabulary: Snapshot, kinds, SLOs, HDR, windows, sources
               (imports nothing of ours)
    worker/    the hot path, inside the load worker processes (model only)
    run/       one run, from RunConfig to exit code: the Session and what it drives
    record/    run directories: recorder, reader, hlog, replay (model only)
    analysis/  soak, report, compare, sweep, calibrate
    fleet/     MQTT: link, publisher, monitor, merged view, remote control (model only)
    sim/       the simulator, a program of its own (nothing of ours)
"""

__version__ = "0.1.0"
