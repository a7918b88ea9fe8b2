"""The one Settings object (pydantic-settings, env prefix ``DYGSERVE_``).

The store's options are one typed config per backend (``state_store.config``),
nested here as ``store``. Set them as ``DYGSERVE_STORE__<FIELD>``, or by the flat
names documented since v1 (``DYGSERVE_REDIS_URL``, ``DYGSERVE_HISTORY_CAP``,
``DYGSERVE_STATE_TTL_S``, ``DYGSERVE_DEDUPE_TTL_S``, ``DYGSERVE_MAX_FUTURE_SKEW``),
which ``FlatStoreNames`` maps into it. A Redis URL picks the Redis backend; no URL
means the embedded in-process store.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from model.checkpoint import BUNDLED_CHECKPOINT
from state_store.config import MemoryStoreConfig, StoreConfig
from state_store.factory import is_memory_url

from .schemas import DEFAULT_MAX_BATCH_EVENTS, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_SCORE_PAIRS

DEFAULT_CHECKPOINT = BUNDLED_CHECKPOINT
ENV_PREFIX = "DYGSERVE_"


class FlatStoreNames(PydanticBaseSettingsSource):
    """The v1 environment names of store options, as entries of ``store``."""

    NAMES = {
        "REDIS_URL": "url",
        "HISTORY_CAP": "history_cap",
        "STATE_TTL_S": "state_ttl_s",
        "DEDUPE_TTL_S": "dedupe_ttl_s",
        "MAX_FUTURE_SKEW": "max_future_skew",
    }

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # everything comes from __call__

    def __call__(self) -> dict[str, Any]:
        store = {
            field: os.environ[ENV_PREFIX + name]
            for name, field in self.NAMES.items()
            if ENV_PREFIX + name in os.environ
        }
        return {"store": store} if store else {}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="ignore"
    )

    checkpoint: Path = Field(DEFAULT_CHECKPOINT, description="checkpoint directory served at start")
    models_dir: Path | None = Field(
        None,
        description="reloads only load from under this folder (default: the checkpoint's parent)",
    )
    store: StoreConfig = Field(
        default_factory=MemoryStoreConfig,
        description="the state store: Redis (single or cluster) when a URL is set, else embedded",
    )
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    workers: int = Field(1, ge=1, le=64)
    api_key: str | None = Field(
        None, description="required in X-API-Key on write and admin routes when set"
    )

    max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, ge=1024)
    max_batch_events: int = Field(DEFAULT_MAX_BATCH_EVENTS, ge=1)
    max_score_pairs: int = Field(DEFAULT_MAX_SCORE_PAIRS, ge=1)
    max_rank_candidates: int = Field(10_000, ge=1)
    max_classify_nodes: int = Field(
        DEFAULT_MAX_SCORE_PAIRS, ge=1, description="nodes per POST /v1/classify"
    )
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

    @model_validator(mode="before")
    @classmethod
    def _store_backend_from_url(cls, data: Any) -> Any:
        """A store block without ``backend`` is Redis when it names a URL, else embedded."""
        if isinstance(data, dict) and isinstance(data.get("store"), dict):
            store = dict(data["store"])
            if "backend" not in store:
                memory = is_memory_url(store.get("url"))
                store["backend"] = "memory" if memory else "redis"
                if memory:
                    store.pop("url", None)
            data = {**data, "store": store}
        return data

    @property
    def embedded_store(self) -> bool:
        return isinstance(self.store, MemoryStoreConfig)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Nested names (DYGSERVE_STORE__...) win over the flat v1 names.
        return (
            init_settings,
            env_settings,
            FlatStoreNames(settings_cls),
            dotenv_settings,
            file_secret_settings,
        )


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
