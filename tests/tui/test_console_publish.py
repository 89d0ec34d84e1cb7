"""`tokentop --publish`: a normal console whose engine also publishes to a real broker."""

from __future__ import annotations

import zlib
from pathlib import Path

import msgspec
from mosquitto import Mosquitto, Recorder, settings, until

from loadgen.model.snapshot import from_json
from loadgen.run.config import PublishTo, RunConfig
from loadgen.run.run_process import RunProcess
from loadgen.run.secrets import Secrets

PASSWORD = "s3cret-pw-for-the-test"


async def test_console_engine_publishes_snapshots_without_the_password(sim, tmp_path,
                                                                       monkeypatch):
    async with Mosquitto(tmp_path, users={"ops": PASSWORD}) as broker:
        cfg = RunConfig(url=sim.url, concurrency=2, output_tokens="12", workers=1, tick=0.5,
                        drain_grace=1.0,
                        publish=PublishTo(broker=broker.url_for("ops"), fleet="lab", name="box1"))
        # the password travels with the Secrets on the run process's pipe, not in its env
        engine = RunProcess(cfg, Secrets(mqtt_password=PASSWORD))
        async with Recorder(settings(broker.url_for("ops"), PASSWORD)) as rec:
            await engine.start()
            seen = []

            async def consume():
                async for snap in engine.snapshots():
                    seen.append(snap)
                    if len(seen) >= 6:
                        return

            await consume()

            def published():
                return [p for t, p, _ in rec.messages if t == "tokentop/lab/box1/snapshot"]

            await until(lambda: len(published()) >= 3, 10, "snapshots on the broker")
            proc = Path(f"/proc/{engine.proc.pid}")
            assert PASSWORD.encode() not in (proc / "environ").read_bytes()
            assert PASSWORD.encode() not in (proc / "cmdline").read_bytes()
            await engine.close()
        payloads = published()
        snap = from_json(zlib.decompress(payloads[-1]))
        assert snap.run_id == seen[0].run_id
        everything = b"".join(zlib.decompress(p) if p[:1] == b"\x78" else p
                              for _, p, _ in rec.messages)
        assert PASSWORD.encode() not in everything
        assert PASSWORD.encode() not in msgspec.json.encode(cfg)
        status = [p for t, p, _ in rec.messages if t == "tokentop/lab/box1/status"]
        assert status and b'"online"' in status[0]
