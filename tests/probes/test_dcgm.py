"""dcgm-exporter pages: parsing against a fixture written from the exporter's documented
fields (the fixture's numbers are the truth), and real scrapes over loopback."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from support import FIXTURES

from probes.dcgm import DcgmError, DcgmGpu, DcgmProbe, energy_between, parse_dcgm

FIXTURE = (FIXTURES / "metrics" / "dcgm-exporter.txt").read_text()
MIB = 1024 * 1024

# What tests/fixtures/metrics/dcgm-exporter.txt says, field by field, in our units:
# framebuffer MiB x 1048576 = bytes, total energy mJ / 1000 = J.
GPU0 = DcgmGpu(
    index=0, uuid="GPU-3f2b9c1e-7a41-4d2e-9b57-0c8e1f6a2d93", name="NVIDIA H100 80GB HBM3",
    device="nvidia0", hostname="gpu-node-7", sm_active=0.873421, sm_occupancy=0.412305,
    tensor_active=0.562188, dram_active=0.689012, gr_engine_active=0.981234,
    gpu_util_pct=97.0, fb_used_bytes=78158 * MIB, fb_free_bytes=2921 * MIB,
    power_w=512.347, energy_j=48213590.417, temperature_c=58.0, memory_temperature_c=47.0,
    sm_clock_mhz=1980.0, mem_clock_mhz=2619.0,
)
GPU1 = DcgmGpu(
    index=1, uuid="GPU-8c16e996-bd76-aa91-17e7-b48bcd0208ba", name="NVIDIA H100 80GB HBM3",
    device="nvidia1", hostname="gpu-node-7", sm_active=0.09125, sm_occupancy=0.030117,
    tensor_active=0.018733, dram_active=0.047306, gr_engine_active=0.104512,
    gpu_util_pct=12.0, fb_used_bytes=10956 * MIB, fb_free_bytes=70123 * MIB,
    power_w=143.908, energy_j=31035686.671, temperature_c=41.0,
    memory_temperature_c=None,  # the fixture has DCGM_INT64_NOT_SUPPORTED there
    sm_clock_mhz=1755.0, mem_clock_mhz=1593.0,
)


def _approx(gpu: DcgmGpu) -> dict:
    # energy in J is mJ / 1000: compare floats as floats, everything else exactly
    fields = {f: getattr(gpu, f) for f in gpu.__struct_fields__}
    return {k: pytest.approx(v) if isinstance(v, float) else v for k, v in fields.items()}


def _without(text: str, *names: str) -> str:
    """The page with these fields' lines (HELP, TYPE and samples) left out."""
    return "".join(line for line in text.splitlines(keepends=True)
                   if not any(f" {n} " in line or line.startswith(n + "{") for n in names))


def test_fixture_gives_the_values_written_in_it() -> None:
    gpus = parse_dcgm(FIXTURE)
    assert [_approx(g) for g in gpus] == [_approx(GPU0), _approx(GPU1)]
    assert isinstance(gpus[0].fb_used_bytes, int)


def test_blank_sentinels_and_nan_are_none_not_numbers() -> None:
    # 9223372036854775794 is an int64 field's NOT_SUPPORTED; 2**47 a double's blank
    page = (
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a"} 9223372036854775794\n'
        'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-a"} 140737488355330.000000\n'
        'DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-a"} NaN\n'
        'DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-a"} 1410\n'
        # an int64 counter above 2**47 is a number (only a double field's blank is 2**47):
        # 140.7 GJ, some years of a 700 W GPU
        'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0",UUID="GPU-a"} 140737488355400\n'
    )
    (gpu,) = parse_dcgm(page)
    assert (gpu.temperature_c, gpu.power_w, gpu.sm_active) == (None, None, None)
    assert gpu.sm_clock_mhz == 1410.0
    assert gpu.energy_j == pytest.approx(140737488355.4)


def test_default_counters_page_has_no_sm_active() -> None:
    """etc/default-counters.csv leaves SM_ACTIVE and SM_OCCUPANCY commented out: a stock
    exporter's page lacks them, and they are None while the rest is read."""
    page = _without(FIXTURE, "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY")
    assert "DCGM_FI_PROF_SM_ACTIVE{" not in page
    gpus = parse_dcgm(page)
    assert [(g.sm_active, g.sm_occupancy) for g in gpus] == [(None, None), (None, None)]
    assert [g.tensor_active for g in gpus] == [0.562188, 0.018733]
    assert [g.dram_active for g in gpus] == [0.689012, 0.047306]


def test_page_with_only_some_fields_and_old_label_names() -> None:
    """No HELP/TYPE, two fields, `uuid` (--use-old-namespace) and `hostname` (4.x+)."""
    page = (
        'DCGM_FI_DEV_POWER_USAGE{gpu="3",uuid="GPU-c",device="nvidia3",hostname="n1"} 61.5\n'
        'DCGM_FI_DEV_FB_USED{gpu="3",uuid="GPU-c",device="nvidia3",hostname="n1"} 2\n'
    )
    assert parse_dcgm(page) == [DcgmGpu(index=3, uuid="GPU-c", device="nvidia3",
                                        hostname="n1", power_w=61.5, fb_used_bytes=2 * MIB)]


def test_mig_instances_of_one_gpu_stay_apart() -> None:
    page = (
        'DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-m",GPU_I_PROFILE="3g.40gb",GPU_I_ID="2"} 0.25\n'
        'DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-m",GPU_I_PROFILE="3g.40gb",GPU_I_ID="1"} 0.75\n'
    )
    assert [(g.mig_instance, g.sm_active) for g in parse_dcgm(page)] == [("1", 0.75),
                                                                        ("2", 0.25)]


@pytest.mark.parametrize("page", ["this is not { prometheus",
                                  "<html><body>404 Not Found</body></html>"])
def test_garbage_is_an_error_in_words(page: str) -> None:
    with pytest.raises(DcgmError, match=r"^not Prometheus text: "):
        parse_dcgm(page)


def test_a_page_without_dcgm_fields_says_so() -> None:
    vllm = (FIXTURES / "metrics" / "vllm.txt").read_text()
    with pytest.raises(DcgmError, match="no DCGM_FI_ fields on the page"):
        parse_dcgm(vllm)


def test_energy_between_two_scrapes_is_the_sum_of_the_differences() -> None:
    before = parse_dcgm(FIXTURE)
    later = FIXTURE.replace("} 48213590417", "} 48214090417")  # GPU 0: +500000 mJ
    later = later.replace("} 31035686671", "} 31035836671")  # GPU 1: +150000 mJ
    assert energy_between(before, parse_dcgm(later)) == pytest.approx(650.0)
    rebooted = FIXTURE.replace("} 31035686671", "} 1200")
    assert energy_between(before, parse_dcgm(rebooted)) is None


# -- real scrapes ------------------------------------------------------------------------


class Exporter:
    """A stand-in dcgm-exporter on loopback: serves `body` with `status`."""

    def __init__(self) -> None:
        self.body = FIXTURE
        self.status = 200
        self.url = ""

    async def handle(self, _: web.Request) -> web.Response:
        return web.Response(status=self.status, text=self.body, content_type="text/plain")


@pytest.fixture
async def exporter() -> AsyncIterator[Exporter]:
    state = Exporter()
    app = web.Application()
    app.router.add_get("/metrics", state.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}/metrics"
    try:
        yield state
    finally:
        await runner.cleanup()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def test_probe_scrapes_the_fixture_then_404_then_garbage(
    exporter: Exporter, session: aiohttp.ClientSession
) -> None:
    probe = DcgmProbe(exporter.url, session)
    s = await probe.sample()
    assert s.ok and s.error is None
    assert [_approx(g) for g in s.gpus] == [_approx(GPU0), _approx(GPU1)]
    assert s.scrape_ms is not None and s.scrape_ms >= 0

    exporter.status = 404
    s = await probe.sample()
    assert (s.ok, s.gpus, s.error) == (False, [], f"HTTP 404 from {exporter.url}")

    exporter.status = 200
    exporter.body = "this is not { prometheus"
    s = await probe.sample()
    assert not s.ok and s.error is not None and s.error.startswith("not Prometheus text: ")


def _closed_port() -> int:
    # Bind then close: nothing listens there right after.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_refused_port_is_connection_refused(session: aiohttp.ClientSession) -> None:
    s = await DcgmProbe(f"http://127.0.0.1:{_closed_port()}/metrics", session).sample()
    assert (s.ok, s.gpus, s.error) == (False, [], "connection refused")
