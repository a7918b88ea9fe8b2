"""Dynamic batching of score requests: concurrent requests share one model call.

Scoring one pair costs a fixed ~2 ms of framework work (a store read, a few dozen
small torch ops), and concurrent requests run in worker threads that fight over the
GIL between every torch op, so under load each one took several times its own cost.
The batcher keeps ONE scoring call in flight: requests that arrive while it runs are
queued, and the next call scores all of them together (``Engine.score_pairs`` is
vectorised over pairs). There is no waiting timer: an idle service scores a lone
request at once, a busy one amortises the fixed cost over everything that queued
(the adaptive batching of model servers such as Triton, without the delay knob).

A call of at most ``loop_max_pairs`` pairs first tries ``Engine.score_pairs_on_loop``:
the state read is awaited and the few-pair read-out (well under a millisecond) runs
on the loop, so a lone GET does not wait for a worker thread to wake, block on Redis,
and wake the loop again. Anything that path cannot do (cold or unknown nodes, pairs
without a time, a store without awaited reads) goes to the worker thread as before.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from starlette.concurrency import run_in_threadpool

from . import metrics
from .engine import Engine, Pair, ScoredPair


@dataclass
class _Waiting:
    pairs: list[Pair]
    future: asyncio.Future


class ScoreBatcher:
    def __init__(
        self, engine: Callable[[], Engine], max_pairs: int = 8192, loop_max_pairs: int = 0
    ) -> None:
        self._engine = engine
        self.max_pairs = max_pairs
        self.loop_max_pairs = loop_max_pairs
        self._queue: deque[_Waiting] = deque()
        self._draining = False

    async def score(self, pairs: list[Pair]) -> tuple[list[ScoredPair], str]:
        """Scores of ``pairs`` (in order) and the model version that computed them."""
        future = asyncio.get_running_loop().create_future()
        self._queue.append(_Waiting(pairs, future))
        if not self._draining:
            self._draining = True
            asyncio.get_running_loop().create_task(self._drain())
        return await future

    def _take(self) -> list[_Waiting]:
        """The queued requests for one call: at least one, then up to ``max_pairs``."""
        batch: list[_Waiting] = []
        n = 0
        while self._queue and (not batch or n + len(self._queue[0].pairs) <= self.max_pairs):
            item = self._queue.popleft()
            batch.append(item)
            n += len(item.pairs)
        return batch

    async def _drain(self) -> None:
        try:
            while self._queue:
                batch = self._take()
                live = [w for w in batch if not w.future.cancelled()]  # clients that hung up
                if not live:
                    continue
                pairs = [p for w in live for p in w.pairs]
                metrics.BATCH_SIZE.labels(kind="score_call").observe(len(pairs))
                try:
                    engine = self._engine()
                    done = (
                        await engine.score_pairs_on_loop(pairs)
                        if len(pairs) <= self.loop_max_pairs
                        else None
                    )
                    scored, version = (
                        done
                        if done is not None
                        else await run_in_threadpool(engine.score_pairs, pairs)
                    )
                except Exception as exc:  # the store or the model failed: every request in it
                    for w in live:
                        if not w.future.done():
                            w.future.set_exception(exc)
                    continue
                start = 0
                for w in live:
                    if not w.future.done():
                        w.future.set_result((scored[start : start + len(w.pairs)], version))
                    start += len(w.pairs)
        finally:
            self._draining = False
