"""``GET /v1/model`` and ``POST /v1/admin/reload``: what is served, and a hot switch.

A reload changes the store's serving version, which every worker and replica follows
(``service.model_follower``); the worker that handled it switches at once, the others
within ``DYGSERVE_MODEL_POLL_S`` plus a checkpoint load."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Depends
from starlette.concurrency import run_in_threadpool

from model.checkpoint import CheckpointError
from model.node_head import ACTIVITY_DIM, RECENT_PACE_DIM

from ..auth import require_api_key, require_read_key
from ..deps import EngineDep, FollowerDep, SettingsDep
from ..engine import Engine, ModelRuntime, RequestRefused
from ..errors import ERROR_RESPONSES
from ..gc_tuning import refreeze
from ..model_follower import ModelFollower, replica_name
from ..public_info import checkpoint_name, without_absolute_paths
from ..schemas import KernelInfo, ModelInfo, NodeHeadInfo, ReloadRequest

log = logging.getLogger("dygserve")
router = APIRouter(tags=["admin"], responses=ERROR_RESPONSES)


# What /v1/model shows of node_metrics.json: the figures, not the training history.
NODE_METRIC_KEYS = ("val", "test", "best_epoch", "events", "train_config")


def node_head_info(rt: ModelRuntime) -> NodeHeadInfo | None:
    loaded = rt.node_head
    if loaded is None:
        return None
    c = loaded.config
    inputs = {"readout": c.d_readout, "event_features": c.event_feature_dim}
    inputs["activity"] = ACTIVITY_DIM if c.use_activity else 0
    inputs["recent_pace"] = RECENT_PACE_DIM if c.use_recent_pace else 0
    inputs["recent_neighbours"] = c.recent_neighbours
    shown = {k: loaded.metrics[k] for k in NODE_METRIC_KEYS if k in loaded.metrics}
    tuned = loaded.metrics.get("fine_tune")
    if isinstance(tuned, dict):
        shown["fine_tune"] = {k: v for k, v in tuned.items() if k != "history"}
    return NodeHeadInfo(
        head_version=loaded.version,
        link_model_version=c.link_model_version,
        task=c.task,
        label=c.label,
        event_feature_dim=c.event_feature_dim,
        inputs=inputs,
        fine_tuned="fine_tuned_from" in rt.checkpoint.metrics,
        metrics=without_absolute_paths(shown),
    )


def model_info(engine: Engine, follower: ModelFollower) -> ModelInfo:
    rt = engine.runtime
    # The onnx backend's sessions report the providers they really got; torch has none.
    providers = getattr(rt.model, "session_providers", {}).get("readout_head")
    behind = follower.behind_s
    return ModelInfo(
        model_version=rt.version,
        store_model_version=follower.store_version,
        behind_store_s=None if behind is None else round(behind, 3),
        replica=replica_name(),
        checkpoint=checkpoint_name(rt.checkpoint.path),  # no absolute paths (public_info)
        backend=rt.backend,
        device=str(rt.device),
        kernels=KernelInfo(
            path=rt.kernels.path,
            reason=rt.kernels.reason,
            scoring_providers=list(providers) if providers is not None else None,
        ),
        config=rt.config.model_dump(mode="json"),
        metrics=without_absolute_paths(rt.checkpoint.metrics),
        node_head=node_head_info(rt),
    )


@router.get("/v1/model", dependencies=[Depends(require_read_key)])
async def get_model(engine: EngineDep, follower: FollowerDep) -> ModelInfo:
    return model_info(engine, follower)


@router.post("/v1/admin/reload", dependencies=[Depends(require_api_key)])
async def reload(
    body: ReloadRequest, engine: EngineDep, settings: SettingsDep, follower: FollowerDep
) -> ModelInfo:
    """Make another checkpoint under the models directory the serving version of every
    worker; states of the new version rebuild lazily from history (or with
    `dygserve backfill`), and those it left stale catch up from their blobs."""
    root = follower.root
    try:  # a NUL byte in the name is a ValueError, a name over NAME_MAX an OSError
        target = (root / body.checkpoint).resolve()
    except (OSError, ValueError) as exc:
        raise RequestRefused(
            422, f"checkpoint refused, still serving {engine.runtime.version}: {exc}"
        ) from exc
    if not target.is_relative_to(root):
        raise RequestRefused(403, "checkpoints load only from under the models directory")
    try:
        runtime = await run_in_threadpool(
            ModelRuntime.load,
            target,
            settings.backend,
            None,
            settings.device,
            settings.checkpoint_verify_key(),
        )
    except (CheckpointError, OSError, ValueError) as exc:
        raise RequestRefused(
            422, f"checkpoint refused, still serving {engine.runtime.version}: {exc}"
        ) from exc
    # Only a checkpoint that loaded here becomes the store's serving version.
    old_version = await run_in_threadpool(follower.publish_and_switch, runtime)
    log.info("reloaded: %s -> %s (the store's serving version)", old_version, runtime.version)
    # The old model is garbage once its last request ends; free its cycles, freeze the new one.
    await run_in_threadpool(refreeze)
    return model_info(engine, follower)
