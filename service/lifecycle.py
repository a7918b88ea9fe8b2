"""What the app builds at start and releases at stop (FastAPI's lifespan): the
loaded model, the store, the engine, the score batcher, the model follower, and the
background tasks (the re-drive loop, the serving-version poll, ``wait=false`` applies)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import torch
from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from state_store.base import StoreUnavailable
from state_store.factory import open_store

from . import metrics
from .batcher import ScoreBatcher
from .engine import Engine, ModelRuntime
from .gc_tuning import freeze_startup_objects, refreeze
from .live_eval import LiveEvaluator
from .malloc_tuning import keep_freed_memory
from .model_follower import ModelFollower
from .settings import Settings

log = logging.getLogger("dygserve")
REDRIVE_INTERVAL_S = 1.0


class BackgroundTasks:
    """Tasks that outlive the request that started them (a ``wait=false`` apply):
    kept referenced until done, so the loop does not drop them half-way."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    torch.set_num_threads(settings.torch_threads)
    keep_freed_memory()  # big torch temporaries reuse heap pages instead of faulting in new ones
    runtime = ModelRuntime.load(
        settings.checkpoint,
        settings.backend,
        settings.onnx_dir,
        settings.device,
        settings.checkpoint_verify_key(),
    )
    store = open_store(settings.store)
    try:
        # A replica with another number of log partitions than the store's refuses to
        # start (state_store.layout.LayoutMismatch); a store that cannot be reached now
        # is checked on first use instead (partitioned log) or at the next start.
        store.claim_layout()
    except StoreUnavailable:
        log.warning("store unavailable at start; its layout is checked later")
    engine = Engine(
        runtime,
        store,
        numpy_max_pairs=settings.numpy_score_max_pairs,
        overlap_append=settings.ingest_overlap,
    )
    live_eval = LiveEvaluator.from_settings(settings)  # None when the rate is 0
    if live_eval is not None:
        engine.apply_watch = live_eval.watch
    app.state.engine = engine
    # One scoring call in flight; requests that arrive meanwhile share the next one.
    app.state.batcher = ScoreBatcher(
        lambda: engine,
        max_pairs=max(settings.max_score_pairs, settings.max_rank_candidates),
        loop_max_pairs=settings.loop_score_max_pairs,
    )
    app.state.background = BackgroundTasks()
    app.state.ready = False
    follower = app.state.follower = ModelFollower(engine, settings)
    metrics.set_model_version(runtime.version)
    metrics.set_kernel_path(runtime.kernels.path)
    metrics.MODEL_BEHIND_STORE.set(0)
    redrive_task = asyncio.create_task(_redrive_loop(app))
    follow_task = asyncio.create_task(_follow_loop(follower, settings.model_poll_s))
    try:
        await run_in_threadpool(follower.start)  # serve what the store names, before any apply
        await run_in_threadpool(engine.redrive)
        await run_in_threadpool(engine.score_pairs, [("__warmup_a__", "__warmup_b__", 0.0)])
        freeze_startup_objects()  # no full GC pass walks the model and framework again
        app.state.ready = True
    except StoreUnavailable:
        log.warning("store unavailable at start; will retry the re-drive in the background")
    log.info("serving model %s", engine.runtime.version)
    yield
    app.state.ready = False
    redrive_task.cancel()
    follow_task.cancel()
    if live_eval is not None:
        live_eval.close()
    await store.aclose()
    store.close()


async def _redrive_loop(app: FastAPI) -> None:
    """Re-drive logged-but-unapplied events after a failed apply or a store outage."""
    while True:
        await asyncio.sleep(REDRIVE_INTERVAL_S)
        engine: Engine = app.state.engine
        if not engine.needs_redrive and app.state.ready:
            continue
        try:
            await run_in_threadpool(engine.redrive)
            app.state.ready = True
        except StoreUnavailable as exc:
            if exc.unreachable:  # a full store still serves reads: stay ready
                app.state.ready = False
        except Exception:  # keep the loop alive; the next tick tries again
            log.exception("re-drive failed")


async def _follow_loop(follower: ModelFollower, interval_s: float) -> None:
    """Follow the store's serving version (service.model_follower)."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            if await run_in_threadpool(follower.poll):
                await run_in_threadpool(refreeze)  # the old model is garbage now
        except StoreUnavailable:
            pass  # the re-drive loop reports readiness; the next tick reads again
        except Exception:  # keep the loop alive; the next tick tries again
            log.exception("following the serving version failed")
