"""GPUs: one line each (memory bar, utilisation, power, temperature, clocks, throttling),
or why there are none; tokens per joule in the title."""

from __future__ import annotations

from loadgen.model import units
from loadgen.model.snapshot import GpuSample, GpuStatus
from probes.throttle import BENIGN_REASONS
from tui.format import MUTED, cells, joined_to_fit, literal
from tui.view import View
from tui.widgets.panel import Panel

HOT_C = 85.0  # where most datacentre GPUs start to throttle
MEM_FULL = 0.95
# clock-event reasons that are not a slowdown worth a warning


def short_name(name: str, width: int) -> str:
    """Vendor prefix off (every row would say it), cut to `width`."""
    for prefix in ("NVIDIA ", "Nvidia "):
        name = name.removeprefix(prefix)
    return name if len(name) <= width else name[: width - 1] + "…"


def bar(used: int | None, total: int | None, width: int) -> str:
    if used is None or not total:
        return f"[{MUTED}]{'·' * width}[/]"
    frac = min(max(used / total, 0.0), 1.0)
    filled = round(frac * width)
    colour = "$warning" if frac >= MEM_FULL else "$primary"
    return f"[{colour}]{'█' * filled}[/][{MUTED}]{'░' * (width - filled)}[/]"


def power(g: GpuSample) -> str:
    if g.power_w is None:
        return units.NA  # no unit on a figure that is not there
    if g.power_limit_w is None:
        return f"{g.power_w:.0f} W"
    return f"{g.power_w:.0f}/{g.power_limit_w:.0f} W"


def temperature(g: GpuSample) -> str:
    if g.temperature_c is None:
        return f"{units.NA:>4}"
    text = f"{g.temperature_c:.0f}°C".rjust(4)
    return f"[$warning]{text}[/]" if g.temperature_c >= HOT_C else text


def clocks(g: GpuSample) -> str:
    if g.simulated and g.sm_clock_mhz is None and g.mem_clock_mhz is None:
        return ""  # the simulator models no clocks: nothing to say, not "n/a"
    sm = units.NA if g.sm_clock_mhz is None else f"{g.sm_clock_mhz:.0f}"
    if g.mem_clock_mhz is None:
        return f"[{MUTED}]SM[/] {sm} MHz"
    return f"[{MUTED}]SM[/] {sm} [{MUTED}]mem[/] {g.mem_clock_mhz:.0f} MHz"


def throttle(g: GpuSample) -> str:
    """The reasons in words; slowdowns in the warning colour."""
    if g.throttle_reasons is None:
        return ""
    bad = [r for r in g.throttle_reasons if r not in BENIGN_REASONS]
    if bad:
        return f"[b $warning]throttled: {literal(', '.join(bad))}[/]"
    if g.throttle_reasons:
        return f"[{MUTED}]{literal(', '.join(g.throttle_reasons))}[/]"
    return f"[{MUTED}]no throttling[/]"


def extra_parts(g: GpuSample) -> list[str]:
    """What follows a GPU's figures, most telling first: an uncorrected ECC error and a
    slowdown, then the clocks, PCIe and benign clock reasons."""
    reasons = throttle(g)
    bad = "throttled" in reasons
    parts = [f"[b $error]ECC uncorrected {g.ecc_uncorrected}[/]"] if g.ecc_uncorrected else []
    if bad:
        parts.append(reasons)
    parts.append(clocks(g))
    if g.pcie_tx_kbs is not None and g.pcie_rx_kbs is not None:
        tx, rx = g.pcie_tx_kbs / 1024, g.pcie_rx_kbs / 1024
        parts.append(f"[{MUTED}]PCIe[/] ↑{tx:.0f} ↓{rx:.0f} MB/s")
    if not bad:
        parts.append(reasons)
    return [p for p in parts if p]


def extras(g: GpuSample) -> str:
    return "  ".join(extra_parts(g))


# the columns of a GPU line beside its name and bar: index 2, memory 14, util 10, power 10,
# temperature 4, and the blanks between
FIXED_W = 2 + 1 + 1 + 1 + 14 + 1 + 10 + 1 + 10 + 1 + 4
NAME_MAX, NAME_MIN, BAR_MIN, BAR_MAX = 32, 8, 6, 40


def name_and_bar(name: str, room: int) -> tuple[int, int]:
    """(name width, bar width) in `room` columns: the whole name up to NAME_MAX, the bar
    what is left (BAR_MIN..BAR_MAX); a narrow line shortens the bar before the name."""
    name_w = min(len(short_name(name, NAME_MAX)), NAME_MAX)
    bar_w = room - name_w
    if bar_w < BAR_MIN:
        name_w = max(NAME_MIN, room - BAR_MIN)
        bar_w = BAR_MIN
    return name_w, min(BAR_MAX, bar_w)


def gpu_line(g: GpuSample, width: int, tag_simulated: bool, two_lines: bool,
             name_w: int | None = None) -> str:
    """One GPU's figures; `name_w`: the width every row's name gets (so they line up)."""
    if g.lost:
        why = literal(g.message or "fell off the bus")
        return f"[b]{g.index}[/] {literal(short_name(g.name, 12))} [b $error]lost: {why}[/]"
    tag = " [$accent]simulated[/]" if tag_simulated and g.simulated else ""
    more = extra_parts(g)
    room = width - FIXED_W - cells(tag)  # for the name, the bar and what follows
    if name_w is None:
        name_w = name_and_bar(g.name, room)[0]
    # one line: the most telling extra follows, while the bar keeps BAR_MIN; else it is
    # left out whole (the `g` screen has it), never cut
    after = f"  {more[0]}" if more and not two_lines else ""
    if room - name_w - cells(after) < BAR_MIN:
        after = ""
    bar_w = min(BAR_MAX, max(BAR_MIN, room - name_w - cells(after)))
    parts = [
        f"[b]{g.index}[/] {literal(short_name(g.name, name_w).ljust(name_w))}",
        bar(g.memory_used_bytes, g.memory_total_bytes, bar_w),
        units.bytes_pair(g.memory_used_bytes, g.memory_total_bytes).rjust(14),
        f"[{MUTED}]util[/] {units.pct(g.utilization_pct, whole=100):>5}",
        power(g).rjust(10),
        temperature(g),
    ]
    line = " ".join(parts) + tag + after
    if two_lines and more:
        indent = " " * (name_w + 3)
        line += "\n" + joined_to_fit(width, indent + more[0], more[1:])
    return line


def gpu_lines(status: GpuStatus, width: int, two_lines: bool = False) -> tuple[bool, list[str]]:
    """(all simulated, lines); a missing GPU is said in words, never as an empty panel."""
    if status.source == "none" or not status.gpus:
        why = status.message or ("no GPU data" if status.source == "none" else "no GPUs found")
        return False, [f"[$warning]{literal(why)}[/]"]
    all_sim = status.source == "simulated" or all(g.simulated for g in status.gpus)
    # when every GPU is simulated the title says so once; mixed sets tag each row
    # one name width for every row, so their bars and figures line up
    names = [name_and_bar(g.name, width - FIXED_W - (0 if all_sim else cells(" simulated")))[0]
             for g in status.gpus if not g.lost]
    name_w = min(names) if names else None
    return all_sim, [gpu_line(g, width, not all_sim, two_lines, name_w) for g in status.gpus]


# tokens per joule moves in the title only when it moved by this much: a changed title
# repaints the whole panel, and the per-tick figure jitters by a few % (2.46, 2.39, 2.51 …)
TPJ_STEP = 0.05


class GpuPanel(Panel):
    TITLE = "GPU"

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._tpj: float | None = None

    def _steady_tpj(self, tpj: float | None) -> float | None:
        shown = self._tpj
        if tpj is None or shown is None or abs(tpj - shown) >= TPJ_STEP * shown:
            self._tpj = tpj
        return self._tpj

    def render_view(self, view: View, width: int) -> tuple[str, str]:
        two = self._tall() and len(view.snap.gpu.gpus) <= 4
        all_sim, lines = gpu_lines(view.snap.gpu, width, two)
        if view.snap.target.about and view.snap.target.simulated:
            # the simulated GPU's panel is where one looks for what the "hardware" is
            lines.append(f"[{MUTED}]{literal(view.snap.target.about)}[/]")
        title = f"{self.TITLE} · simulated" if all_sim else self.TITLE
        eff = view.snap.efficiency
        tpj = self._steady_tpj(eff.tokens_per_joule if eff is not None else None)
        if tpj is not None:
            title += f" · {tpj:.2f} tok/J"
        return title, "\n".join(lines)
