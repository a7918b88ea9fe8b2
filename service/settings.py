"""The one Settings object (pydantic-settings, env prefix ``DYGSERVE_``)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from model.checkpoint import BUNDLED_CHECKPOINT

DEFAULT_CHECKPOINT = BUNDLED_CHECKPOINT


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DYGSERVE_", extra="ignore")

    checkpoint: Path = Field(DEFAULT_CHECKPOINT, description="checkpoint directory served at start")
    models_dir: Path | None = Field(
        None,
        description="reloads only load from under this folder (default: the checkpoint's parent)",
    )
    redis_url: str | None = Field(
        None, description="redis://host:port/db or redis+cluster://host:port; none = embedded store"
    )
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    workers: int = Field(1, ge=1, le=64)
    api_key: str | None = Field(
        None, description="required in X-API-Key on write and admin routes when set"
    )

    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    max_batch_events: int = Field(10_000, ge=1)
    max_score_pairs: int = Field(10_000, ge=1)
    max_rank_candidates: int = Field(10_000, ge=1)
    max_in_flight: int = Field(64, ge=1, description="requests in progress beyond this get 503")
    loop_score_max_pairs: int = Field(
        16,
        ge=0,
        description="score calls up to this many pairs run on the event loop after an awaited read (0 = never)",
    )
    numpy_score_max_pairs: int = Field(
        256,
        ge=0,
        description="torch backend: score calls up to this many pairs run the numpy kernel (0 = never)",
    )

    late_policy: Literal["reject"] = Field(
        "reject", description="what happens to an event older than a node's last event"
    )
    max_future_skew: float | None = Field(
        None, ge=0, description="reject events this far beyond the latest event time"
    )
    history_cap: int = Field(10_000, ge=1, description="events kept per node for cold rebuilds")
    state_ttl_s: int | None = Field(
        None, ge=1, description="TTL of state blobs (they rebuild from history when gone)"
    )
    dedupe_ttl_s: int = Field(7 * 24 * 3600, ge=1, description="how long event ids are remembered")
    backend: Literal["torch", "onnx"] = Field(
        "torch", description="inference backend: PyTorch or onnxruntime (same numbers)"
    )
    onnx_dir: Path | None = Field(
        None, description="pre-exported ONNX graphs of the checkpoint (default: export at start)"
    )
    torch_threads: int = Field(1, ge=1)
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="where the torch backend runs ingest, cold rebuilds and scoring: auto = CUDA when present",
    )


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
