"""GPU profiling counters from a dcgm-exporter /metrics page (`--dcgm-url`).

NVML (probes.nvml) says how busy a GPU is only as "a kernel ran in the last
sample period"; DCGM's profiling fields say how much of the GPU did work: SM
activity, tensor-pipe activity and DRAM activity (the share of cycles the memory
interface moved data, i.e. memory-bandwidth use). Those are what `tokentop eval`'s
efficiency row needs, and dcgm-exporter is how clusters already publish them.

Field names, units and labels are dcgm-exporter's (etc/default-counters.csv and
internal/pkg/rendermetrics): one sample per GPU per field, labelled `gpu` (the
index), `UUID` (`uuid` with --use-old-namespace), `device`, `modelName` and
`Hostname` (`hostname` since May 2026), plus `GPU_I_ID` on a MIG instance.
Units are converted here: framebuffer MiB to bytes, total energy mJ ("Total
energy consumption since boot (in mJ)") to joules; ratios stay 0..1.

As in probes.nvml, a field the GPU or the exporter's counters file does not
have is None ("n/a"), never an error: absent from the page, NaN, or one of
DCGM's blank sentinels, which exporters before 4.x printed as numbers
(9223372036854775794 is DCGM_INT64_NOT_SUPPORTED). A page that cannot be
read at all is an error in words, in `DcgmSample.error`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

import aiohttp
import msgspec
from prometheus_client.parser import text_string_to_metric_families

from loadgen.model.text import plain
from probes import server_metrics
from probes.server_metrics import describe_error

MIB = 1024 * 1024
LABEL_LIMIT = 120  # characters of a label's text kept (a GPU's model name, a host name)

# DCGM's blank values (dcgm_structs.h): the base and the +1..+15 above it (not found, not
# supported, no permission, ...) all mean "no value". Integer fields use the int64 base,
# double fields (power, the PROF ratios) the fp64 one, 2**47.
DCGM_INT64_BLANK = 0x7FFFFFFFFFFFFFF0
DCGM_FP64_BLANK = 140737488355328.0


class DcgmError(ValueError):
    """A page that is not a dcgm-exporter page; str(e) says why, in one line."""


class DcgmGpu(msgspec.Struct, kw_only=True):
    """One GPU (or MIG instance) as dcgm-exporter reports it; None: not reported."""

    index: int  # the `gpu` label: DCGM's GPU id, nvidia-smi's index
    uuid: str | None = None
    name: str | None = None  # modelName, e.g. "NVIDIA H100 80GB HBM3"
    device: str | None = None  # e.g. "nvidia0"
    hostname: str | None = None
    mig_instance: str | None = None  # GPU_I_ID of a MIG instance; None: the whole GPU
    sm_active: float | None = None  # 0..1: cycles an SM had at least one warp assigned
    sm_occupancy: float | None = None  # 0..1: resident warps of the maximum
    tensor_active: float | None = None  # 0..1: cycles the tensor (HMMA) pipe was active
    dram_active: float | None = None  # 0..1: cycles the memory interface moved data
    gr_engine_active: float | None = None  # 0..1: time the graphics/compute engine was busy
    gpu_util_pct: float | None = None  # 0..100, NVML's coarse "a kernel ran" utilisation
    fb_used_bytes: int | None = None
    fb_free_bytes: int | None = None
    power_w: float | None = None
    energy_j: float | None = None  # since boot (a counter: efficiency uses differences)
    temperature_c: float | None = None
    memory_temperature_c: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None


class DcgmSample(msgspec.Struct, kw_only=True):
    """One scrape: the GPUs, or why there are none."""

    url: str
    ok: bool
    gpus: list[DcgmGpu] = msgspec.field(default_factory=list)
    error: str | None = None
    scrape_ms: float | None = None


class _Field(msgspec.Struct, frozen=True):
    attr: str  # DcgmGpu attribute
    scale: float = 1.0  # exporter unit -> ours
    double: bool = False  # a DCGM double field (its blank is DCGM_FP64_BLANK)
    whole: bool = False  # stored as an int (bytes)


FIELDS: dict[str, _Field] = {
    "DCGM_FI_PROF_SM_ACTIVE": _Field("sm_active", double=True),
    "DCGM_FI_PROF_SM_OCCUPANCY": _Field("sm_occupancy", double=True),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": _Field("tensor_active", double=True),
    "DCGM_FI_PROF_DRAM_ACTIVE": _Field("dram_active", double=True),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": _Field("gr_engine_active", double=True),
    "DCGM_FI_DEV_GPU_UTIL": _Field("gpu_util_pct"),
    "DCGM_FI_DEV_FB_USED": _Field("fb_used_bytes", scale=MIB, whole=True),
    "DCGM_FI_DEV_FB_FREE": _Field("fb_free_bytes", scale=MIB, whole=True),
    "DCGM_FI_DEV_POWER_USAGE": _Field("power_w", double=True),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": _Field("energy_j", scale=1e-3),
    "DCGM_FI_DEV_GPU_TEMP": _Field("temperature_c"),
    "DCGM_FI_DEV_MEMORY_TEMP": _Field("memory_temperature_c"),
    "DCGM_FI_DEV_SM_CLOCK": _Field("sm_clock_mhz"),
    "DCGM_FI_DEV_MEM_CLOCK": _Field("mem_clock_mhz"),
}


def parse_dcgm(text: str) -> list[DcgmGpu]:
    """The GPUs on one dcgm-exporter page, by index (then MIG instance).

    Raises DcgmError when the text is not Prometheus text, or holds no DCGM field.
    """
    families = _families(text)
    gpus: dict[tuple[int, str | None], DcgmGpu] = {}
    seen_dcgm = False
    for family in families:
        # The family's name, not the sample's: the parser renames a counter's samples
        # to NAME_total, and the exporter's counters have no such suffix.
        seen_dcgm = seen_dcgm or family.name.startswith("DCGM_FI_")
        spec = FIELDS.get(family.name)
        if spec is None:
            continue
        for sample in family.samples:
            gpu = _gpu_for(gpus, sample.labels)
            if gpu is not None:
                setattr(gpu, spec.attr, _value(spec, float(sample.value)))
    if not seen_dcgm:
        raise DcgmError("no DCGM_FI_ fields on the page: is the URL a dcgm-exporter /metrics?")
    return [gpus[key] for key in sorted(gpus, key=lambda k: (k[0], k[1] or ""))]


def _families(text: str) -> list:
    try:
        return list(text_string_to_metric_families(text))
    except Exception as exc:  # the parser raises ValueError and friends on other text
        raise DcgmError(f"not Prometheus text: {_first_line(exc)}") from None


def _gpu_for(gpus: dict[tuple[int, str | None], DcgmGpu],
             labels: dict[str, str]) -> DcgmGpu | None:
    """The GPU a sample belongs to, made on its first sample; None without a `gpu` index
    (NVSwitch and NVLink samples carry other labels)."""
    try:
        index = int(labels["gpu"])
    except (KeyError, ValueError):
        return None
    key = (index, labels.get("GPU_I_ID"))
    if key not in gpus:
        gpus[key] = DcgmGpu(
            index=index,
            uuid=_label(labels, "UUID"),
            name=_label(labels, "modelName"),
            device=_label(labels, "device"),
            hostname=_label(labels, "Hostname"),
            mig_instance=key[1],
        )
    return gpus[key]


def _label(labels: dict[str, str], name: str) -> str | None:
    """A label by name, in either case: exporters renamed UUID/uuid and Hostname/hostname."""
    value = labels.get(name)
    if value is None:
        value = labels.get(name.lower())
    return (plain(value, LABEL_LIMIT) or None) if value else None  # the exporter's text


def _value(spec: _Field, raw: float) -> float | int | None:
    """The exporter's number in our unit, or None for NaN and DCGM's blank sentinels."""
    blank = DCGM_FP64_BLANK if spec.double else float(DCGM_INT64_BLANK)
    if not math.isfinite(raw) or raw >= blank:
        return None
    value = raw * spec.scale
    return round(value) if spec.whole else value


def energy_between(before: Iterable[DcgmGpu], after: Iterable[DcgmGpu]) -> float | None:
    """Joules all GPUs used between two scrapes (the energy counters' differences, by UUID);
    None when a GPU lacks the counter in either, or a counter went down (a reboot or a
    driver reload), so that no efficiency figure is built on half the GPUs."""
    start = {g.uuid: g.energy_j for g in before}
    total = 0.0
    counted = 0
    for gpu in after:
        was = start.get(gpu.uuid)
        if gpu.uuid is None or was is None or gpu.energy_j is None or gpu.energy_j < was:
            return None
        total += gpu.energy_j - was
        counted += 1
    return total if counted else None


class DcgmProbe:
    """Scrapes one dcgm-exporter. Never raises: a failed scrape is `ok=False` with `error`."""

    def __init__(self, url: str, session: aiohttp.ClientSession) -> None:
        self.url = url
        self._session = session

    async def sample(self) -> DcgmSample:
        start = time.perf_counter()
        result = await self._scrape()
        result.scrape_ms = (time.perf_counter() - start) * 1000.0
        return result

    async def _scrape(self) -> DcgmSample:
        try:
            text = await server_metrics.fetch_page(self._session, self.url)
            return DcgmSample(url=self.url, ok=True, gpus=parse_dcgm(text))
        except (server_metrics.HttpStatus, DcgmError) as exc:
            return DcgmSample(url=self.url, ok=False, error=str(exc))
        except Exception as exc:  # connection refused, timeouts, resets: in words
            return DcgmSample(url=self.url, ok=False, error=plain(describe_error(exc), 200))


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return plain(lines[0] if lines else type(exc).__name__, 200)
