"""The main screen's panels, one widget per module."""

from tui.widgets.chart import Chart
from tui.widgets.events_panel import EventsPanel
from tui.widgets.gpu_panel import GpuPanel
from tui.widgets.header_bar import HeaderBar
from tui.widgets.host_panel import HostPanel
from tui.widgets.latency_panel import LatencyPanel
from tui.widgets.load_panel import LoadPanel
from tui.widgets.panel import Panel
from tui.widgets.throughput_panel import ThroughputPanel

__all__ = [
    "Chart",
    "EventsPanel",
    "GpuPanel",
    "HeaderBar",
    "HostPanel",
    "LatencyPanel",
    "LoadPanel",
    "Panel",
    "ThroughputPanel",
]
