"""Every worker and replica serves the version the store names (issue 15, defect 2).

The serving version is one key in the store (``state_store.versions.ServingModel``:
the version and the checkpoint's path under the models directory).
``POST /v1/admin/reload`` loads the checkpoint, sets the key, and switches the worker
that handled it; every other worker reads the key every ``model_poll_s`` (one round
trip, together with the version marks that bound stale states) and switches when it
names another version. A worker that starts finds the key and serves what it names;
only where no key is set yet does it publish its own checkpoint.

The mixed-version window after a reload is therefore at most ``model_poll_s`` plus
one checkpoint load per worker. A worker that cannot load what the key names (the
folder is missing on its machine, or holds other bytes than the version) keeps
serving its version, says so (``/v1/model``, ``dygserve_model_behind_store``), retries
every ``model_retry_s``, and after ``model_behind_limit_s`` reports not ready, so a
load balancer stops sending it traffic: the window stays bounded either way.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path

from model.checkpoint import CheckpointError
from state_store.faults import AT_RELOAD, maybe_crash
from state_store.versions import ServingModel

from . import metrics
from .engine import Engine, ModelRuntime
from .settings import Settings

log = logging.getLogger("dygserve")


def models_root(settings: Settings) -> Path:
    """Where checkpoints load from: the models directory (default: the checkpoint's parent)."""
    return (settings.models_dir or Path(settings.checkpoint).parent).resolve()


def replica_name() -> str:
    """Which worker answered: host and process id."""
    return f"{socket.gethostname()}:{os.getpid()}"


class ModelFollower:
    def __init__(self, engine: Engine, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings
        self.root = models_root(settings)
        self.store_version: str | None = None  # what the key named at the last read
        self.behind_since: float | None = None  # monotonic time this worker fell behind it
        self.last_error: str | None = None
        self._failed: tuple[ServingModel, float] | None = None  # last load that failed, when

    # ----- names -------------------------------------------------------------------
    def checkpoint_name(self, path: Path) -> str:
        """The checkpoint as the key names it: relative to the models directory."""
        resolved = Path(path).resolve()
        if resolved.is_relative_to(self.root):
            return resolved.relative_to(self.root).as_posix()
        return str(
            resolved
        )  # the start checkpoint may lie elsewhere; only its own replicas have it

    def resolve(self, name: str) -> Path:
        """A checkpoint the key names: only from under the models directory, or this
        worker's own start checkpoint (which the key names by its absolute path when
        it lies elsewhere)."""
        target = (self.root / name).resolve()
        if target.is_relative_to(self.root) or target == Path(self.settings.checkpoint).resolve():
            return target
        raise CheckpointError(f"{name!r} is outside the models directory {self.root}")

    # ----- blocking steps (worker threads) -------------------------------------------
    def start(self) -> None:
        """At start: publish this worker's checkpoint where no version is set yet, then
        follow whatever the key names."""
        rt = self.engine.runtime
        own = ServingModel(rt.version, self.checkpoint_name(rt.checkpoint.path))
        self.engine.store.publish_serving(own, only_if_absent=True)
        self.poll()

    def poll(self) -> bool:
        """Read the key and the version marks; switch when the key names another
        version. True when this worker switched."""
        state = self.engine.store.read_serving()
        self.engine.refresh_marks(state.marks)
        serving = state.serving
        current = self.engine.runtime
        if serving is None:  # deleted by an operator: this worker's version is the one
            rt = current
            serving = self.engine.store.publish_serving(
                ServingModel(rt.version, self.checkpoint_name(rt.checkpoint.path)),
                only_if_absent=True,
            )
        self.store_version = serving.version
        if serving.version == current.version:
            self._caught_up()
            return False
        if self.behind_since is None:
            self.behind_since = time.monotonic()
            metrics.MODEL_BEHIND_STORE.set(1)
        if self._failed is not None and self._failed[0] == serving:
            if time.monotonic() - self._failed[1] < self.settings.model_retry_s:
                return False
        try:
            runtime = self.load(serving)
        except (CheckpointError, OSError, ValueError) as exc:
            self._failed = (serving, time.monotonic())
            self.last_error = f"cannot load {serving.checkpoint!r} ({serving.version}): {exc}"
            log.warning("still serving %s: %s", current.version, self.last_error)
            return False
        # marks read again after the load: applies of the old version during the load count
        self.switch(runtime, refresh=True)
        log.info("followed the store: %s -> %s", current.version, runtime.version)
        return True

    def load(self, serving: ServingModel) -> ModelRuntime:
        runtime = ModelRuntime.load(
            self.resolve(serving.checkpoint),
            self.settings.backend,
            None,
            self.settings.device,
            self.settings.checkpoint_verify_key(),  # a followed version is checked like a reload
        )
        if runtime.version != serving.version:
            raise CheckpointError(
                f"{serving.checkpoint!r} holds version {runtime.version}, the store serves {serving.version}"
            )
        return runtime

    def publish_and_switch(self, runtime: ModelRuntime) -> str:
        """A reload: make ``runtime`` the store's serving version, then this worker's.
        The old version, for the log."""
        self.engine.store.publish_serving(
            ServingModel(runtime.version, self.checkpoint_name(runtime.checkpoint.path))
        )
        maybe_crash(AT_RELOAD)
        self.store_version = runtime.version
        return self.switch(runtime, refresh=True)

    def switch(self, runtime: ModelRuntime, refresh: bool) -> str:
        marks = self.engine.store.read_serving().marks if refresh else None
        old = self.engine.swap(runtime, marks).version
        metrics.set_model_version(runtime.version, old)
        metrics.set_kernel_path(runtime.kernels.path)
        self._caught_up()
        return old

    def _caught_up(self) -> None:
        if self.behind_since is not None or self._failed is not None:
            metrics.MODEL_BEHIND_STORE.set(0)
        self.behind_since = None
        self._failed = None
        self.last_error = None

    # ----- what /v1/model and /readyz show --------------------------------------------
    @property
    def behind_s(self) -> float | None:
        """Seconds this worker has served another version than the store's; None if not."""
        return None if self.behind_since is None else time.monotonic() - self.behind_since

    @property
    def within_limit(self) -> bool:
        behind = self.behind_s
        return behind is None or behind <= self.settings.model_behind_limit_s
