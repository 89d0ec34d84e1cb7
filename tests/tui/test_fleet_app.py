"""The fleet console through App.run_test(), against real agents and a real mosquitto."""

from __future__ import annotations

import asyncio

from mosquitto import Mosquitto, settings, small_run, start_agent, until

from loadgen.fleet.merged import FleetMergedSource
from loadgen.fleet.monitor import FleetMonitor
from tui.app import TokentopApp
from tui.fleet_app import FleetApp
from tui.widgets.fleet_table import FLEET_KEY, FleetTable


async def test_fleet_console_lists_controls_and_opens_agents(sim, tmp_path):
    async with Mosquitto(tmp_path) as broker:
        b = settings(broker.url)
        monitor = FleetMonitor(b, "t")
        await monitor.start(wait=10)
        agents = [start_agent(small_run(sim.url, concurrency=2), b, "alpha",
                              remote_control=True, max_concurrency=4),
                  start_agent(small_run(sim.url, concurrency=1), b, "beta")]
        try:
            await until(lambda: all(n in monitor.agents and monitor.agents[n].last is not None
                                    for n in ("alpha", "beta")), 30, "both agents")
            app = FleetApp(monitor, refresh=0.1)
            async with app.run_test(size=(140, 24)) as pilot:
                table = app.query_one(FleetTable)
                await until(lambda: table.row_count == 3, 5, "three rows")
                assert [str(k.value) for k in table.rows] == [FLEET_KEY, "alpha", "beta"]
                await until(lambda: "ms" in str(table.get_cell(FLEET_KEY, "ttft")), 10,
                            "the fleet's merged TTFT p99")
                assert "2/2 online" in str(table.get_cell(FLEET_KEY, "state"))
                # select alpha, +1 and +10: applied, then refused over its cap of 4
                table.move_cursor(row=1)
                await pilot.press("plus")
                await until(lambda: len(app.replies) == 1, 5, "a reply")
                assert app.replies[0]["applied"] is True
                await until(lambda: monitor.agents["alpha"].last.load.target_concurrency == 3,
                            3, "alpha at 3 streams")
                await pilot.press("right_square_bracket")
                await until(lambda: len(app.replies) == 2, 5, "a reply")
                assert app.replies[1]["reason"] == \
                    "13 streams is over this agent's --max-concurrency 4"
                # all agents: pause goes to both; beta refuses (remote control off)
                await pilot.press("a", "p")
                await until(lambda: len(app.replies) == 4, 5, "two replies")
                got = {r["agent"]: r["applied"] for r in app.replies[2:]}
                assert got == {"alpha": True, "beta": False}
                await until(lambda: monitor.agents["alpha"].last.load.state == "paused", 3,
                            "alpha paused")
                await pilot.press("a")
                table.move_cursor(row=1)
                await pilot.press("enter")
            assert app.return_value == "alpha"

            # the agent in the ordinary console, fed from MQTT; its keys control it remotely
            view = TokentopApp(monitor.source("alpha"), refresh=0.05)
            async with view.run_test(size=(100, 30)) as pilot:
                await until(lambda: view.drawn_seq is not None, 10, "alpha drawn")
                assert view.source.description.startswith("fleet t/alpha via mqtt://")
                assert "closed c=3" in str(view.query_one("#header").render())
                await pilot.press("minus")
                await until(lambda: monitor.agents["alpha"].last.load.target_concurrency == 2,
                            5, "alpha back at 2 streams")
            assert not monitor.agents["alpha"].listeners  # closing the view only detaches

            # the fleet row opens every agent merged into the same console
            fleet_view = TokentopApp(FleetMergedSource(monitor, tick=0.25), refresh=0.05)
            async with fleet_view.run_test(size=(100, 30)) as pilot:
                await until(lambda: fleet_view.windows.last is not None
                            and fleet_view.windows.last.target.url == "2 of 2 agents", 10,
                            "the merged fleet drawn")
                await until(lambda: str(fleet_view.query_one("#header").render()).startswith(
                    "tokentop  fleet  ● running"), 10, "the header names the fleet view")
                await until(lambda: fleet_view.windows.last.counters.requests_ok > 0, 10,
                            "fleet totals")
            assert monitor.agents["alpha"].state(asyncio.get_running_loop().time()) != "offline"
        finally:
            for task in agents:
                task.cancel()
            await asyncio.gather(*agents, return_exceptions=True)
            await monitor.close()
