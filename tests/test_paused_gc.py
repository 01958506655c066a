"""The executor's garbage-collector pause (graph captures and timed steps)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("enabled", [True, False])
def test_paused_gc_keeps_the_collector_off_inside_and_as_it_was_after(enabled):
    """Captures and timed steps run without a collection, and leave the collector as
    the caller had it, an exception included."""
    import gc

    from stepplan.executor.graphs import paused_gc

    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        with pytest.raises(KeyError), paused_gc():
            assert not gc.isenabled()
            raise KeyError("inside")
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()
