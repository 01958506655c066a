"""A deployment: engine replicas behind a router, on one clock.

``replica.py`` holds one engine instance (its scheduler, memory, planner, cost model and
stepper) that the loop advances a step at a time; ``loop.py`` keeps one clock over
every replica, hands each arrival to the router at its arrival time and lets the
replica whose step ends first step next (ties by replica index: equal inputs give equal
results); ``routers.py`` is the routers' registry. This package's ``__init__`` imports
the registry only, so that the settings (``config.py``) can name the routers.
"""

from __future__ import annotations

from .routers import ROUTER_NAMES, TABLE, RouterEntry, RouterSetup, make_router

__all__ = ["ROUTER_NAMES", "TABLE", "RouterEntry", "RouterSetup", "make_router"]
