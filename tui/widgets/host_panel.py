"""Host and client health: if the load generator saturates, its latencies are suspect."""

from __future__ import annotations

from loadgen.snapshot import ClientSample, HostSample
from tui.format import fmt_bytes_pair, fmt_ms, fmt_num, fmt_pct
from tui.widgets.panel import Panel, View

MUTED = "$foreground-muted"
LAG_WARN_MS = 5.0  # a lag this long shows up in measured ITL
CPU_WARN_PER_WORKER = 90.0  # one worker near a full core queues its own chunks
WIDE_AT = 56


def _warn(text: str, warn: bool) -> str:
    return f"[$warning]{text}[/]" if warn else text


def host_parts(h: HostSample | None) -> tuple[str, str]:
    h = h or HostSample()
    cores = f" [{MUTED}]×{h.cpu_count}[/]" if h.cpu_count else ""
    load = f"{h.load1:.2f}" if h.load1 is not None else fmt_num(None)
    cpu = f"[{MUTED}]CPU[/] {fmt_pct(h.cpu_pct)}{cores}  [{MUTED}]load[/] {load}"
    ram = f"[{MUTED}]RAM[/] {fmt_bytes_pair(h.mem_used_bytes, h.mem_total_bytes)}"
    return cpu, ram


def client_parts(c: ClientSample) -> tuple[str, str]:
    per_worker = None if c.cpu_pct is None else c.cpu_pct / max(c.workers, 1)
    cpu_hot = per_worker is not None and per_worker > CPU_WARN_PER_WORKER
    lag_us = None if c.loop_lag_ms is None else c.loop_lag_ms * 1000.0
    lag_hot = c.loop_lag_ms is not None and c.loop_lag_ms > LAG_WARN_MS
    workers = f"{c.workers} worker" + ("" if c.workers == 1 else "s")
    cpu = f"{workers}  [{MUTED}]CPU[/] {_warn(fmt_pct(c.cpu_pct), cpu_hot)}"
    lag = f"[{MUTED}]loop lag[/] {_warn(fmt_ms(lag_us), lag_hot)}"
    return cpu, lag


class HostPanel(Panel):
    TITLE = "Host · client"

    def render_view(self, view: View, width: int) -> tuple[str, str]:
        host_cpu, host_ram = host_parts(view.snap.host)
        client_cpu, client_lag = client_parts(view.snap.client)
        host = f"[b]{'host':<7}[/]"
        client = f"[b]{'client':<7}[/]"
        if width >= WIDE_AT:
            lines = [f"{host}{host_cpu}  {host_ram}", f"{client}{client_cpu}  {client_lag}"]
        else:
            pad = " " * 7
            lines = [
                f"{host}{host_cpu}",
                f"{pad}{host_ram}",
                f"{client}{client_cpu}",
                f"{pad}{client_lag}",
            ]
        return self.TITLE, "\n".join(lines)
