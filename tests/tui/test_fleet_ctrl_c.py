"""Ctrl-C in the fleet console quits it as q does (Textual's own ctrl+c only says "press
ctrl+q"), against a real mosquitto."""

from __future__ import annotations

import pytest
from mosquitto import Mosquitto, settings, until

from loadgen.fleet.monitor import FleetMonitor
from tui.fleet_app import FleetApp


@pytest.mark.parametrize("key", ["ctrl+c", "q"])
async def test_ctrl_c_quits_the_fleet_console_as_q(tmp_path, key: str) -> None:
    async with Mosquitto(tmp_path) as broker:
        monitor = FleetMonitor(settings(broker.url), "t")
        await monitor.start(wait=10)
        try:
            app = FleetApp(monitor, refresh=0.1)
            async with app.run_test(size=(100, 24)) as pilot:
                await pilot.press(key)
                await until(lambda: app.return_code is not None, 5, "the fleet console exits")
            assert app.return_value is None  # quit, no agent opened
            assert not any("ctrl+q" in n.message for n in app._notifications)
        finally:
            await monitor.close()
