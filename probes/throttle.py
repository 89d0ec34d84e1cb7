"""Decode NVML's clock-event (formerly "clocks throttle") reason bitmask into words.

NVML renamed `nvmlClocksThrottleReason*` to `nvmlClocksEventReason*`; older
pynvml builds only have the first, newer ones both (same bit values). The bits
are read from pynvml at import so a driver/binding update that moves a bit is
picked up instead of being hard-coded here.
"""

from __future__ import annotations

from types import ModuleType

# pynvml suffix -> words shown to the operator. Order is the display order.
_WORDS: dict[str, str] = {
    "SwPowerCap": "power cap",
    "SwThermalSlowdown": "thermal (software)",
    "HwThermalSlowdown": "thermal (hardware)",
    "HwSlowdown": "hardware slowdown",
    "HwPowerBrakeSlowdown": "power brake",
    "SyncBoost": "sync boost",
    "ApplicationsClocksSetting": "applications clocks setting",
    "DisplayClockSetting": "display clocks setting",
    "GpuIdle": "idle",
    # Only in the older "Throttle" naming of some pynvml builds.
    "BoardLimit": "board limit",
    "Reliability": "reliability",
}

# reasons that hold clocks back on purpose or harmlessly: not a throttle worth an event
BENIGN_REASONS = frozenset({"idle", "applications clocks setting", "display clocks setting",
                            "sync boost"})

_PREFIXES = ("nvmlClocksEventReason", "nvmlClocksThrottleReason")


def _load_pynvml() -> ModuleType | None:
    try:
        import pynvml
    except ImportError:  # the binding is a dependency, but decoding must not break without it
        return None
    return pynvml


def reason_bits(nvml: ModuleType | None = None) -> list[tuple[int, str]]:
    """(bit, words) pairs known to the given pynvml module, in display order."""
    module = nvml if nvml is not None else _load_pynvml()
    table: list[tuple[int, str]] = []
    seen: set[int] = set()
    for suffix, words in _WORDS.items():
        bit = _constant(module, suffix)
        if bit is None or bit in seen:
            continue
        seen.add(bit)
        table.append((bit, words))
    return table


def _constant(module: ModuleType | None, suffix: str) -> int | None:
    if module is None:
        return None
    for prefix in _PREFIXES:
        value = getattr(module, prefix + suffix, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


_TABLE = reason_bits()


def decode_throttle_reasons(bits: int) -> list[str]:
    """Words for each reason set in `bits`; bits pynvml does not name come out as hex."""
    reasons: list[str] = []
    known = 0
    for bit, words in _TABLE:
        known |= bit
        if bits & bit:
            reasons.append(words)
    unknown = bits & ~known
    position = 0
    while unknown >> position:
        bit = 1 << position
        if unknown & bit:
            reasons.append(f"unknown (0x{bit:x})")
        position += 1
    return reasons
