"""How long the suite waits for the control plane's work, on a machine other work shares.

A wait's budget is what the work takes on an idle machine. Under load the controllers,
the scheduler and the kubelet get less CPU and take longer, by about the machine's load
per CPU: a wait stretches its budget by that, up to `MOST` times, read anew as it waits, so that
a slow moment is waited out while a wait that can never end still fails in bounded time.
"""

from __future__ import annotations

import os

# The most a budget is stretched: at a load of 2.5 per CPU or more, a 60 s wait may take
# 150 s. The suite's own control plane keeps the load near 1 per CPU on two CPUs, so a wait
# that can never end fails in at most this many times its budget.
MOST = 2.5


def stretch() -> float:
    """Return how much longer than on an idle machine the work takes now: the last minute's
    load per CPU, at least 1 and at most `MOST`."""
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    return min(MOST, max(1.0, load))


def spent(elapsed: float, seconds: float) -> bool:
    """Tell whether a wait of budget `seconds` (on an idle machine) has run out after
    `elapsed` seconds, at the machine's load now."""
    return elapsed > seconds * stretch()
