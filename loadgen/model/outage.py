"""What an outage is, defined once: the live run and the reports both judge by this.

(Skeleton: the tracker lands with issue 13's outage item.)
"""

from __future__ import annotations

# A stream in flight that has received no byte for this long is stalled (a frozen server).
STALL_AFTER_S = 5.0
