"""``service.gc_tuning``: what is alive at start-up leaves the collector's full passes,
and a model switch gives the old model's reference cycles back to them."""

from __future__ import annotations

import gc
import weakref

from service.gc_tuning import freeze_startup_objects, refreeze


class _Node:
    pass


def _cycle() -> weakref.ref:
    a, b = _Node(), _Node()
    a.other, b.other = b, a  # only a full pass can free this
    return weakref.ref(a)


def test_freeze_takes_live_objects_out_of_full_passes_and_refreeze_frees_old_cycles() -> None:
    try:
        keep = [_Node() for _ in range(1000)]
        frozen = freeze_startup_objects()
        assert frozen >= len(keep) and gc.get_freeze_count() == frozen
        assert not any(o is keep[0] for o in gc.get_objects())  # no pass walks them now

        probe = _cycle()  # an old model's cycle: garbage, but frozen before any pass saw it
        gc.freeze()
        gc.collect()
        assert probe() is not None  # frozen cycles are never collected...
        refreeze()
        assert probe() is None  # ...until a switch unfreezes and collects once
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
