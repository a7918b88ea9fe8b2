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

from pydantic import Field, SecretStr, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from model.checkpoint import BUNDLED_CHECKPOINT
from model.signing import check_key
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
    auth_reads: bool = Field(
        False,
        description="also require the API key on the score, rank, nodes and model routes "
        "(a read can trigger a cold rebuild and store writes)",
    )
    checkpoint_key: SecretStr | None = Field(
        None,
        description="HMAC-SHA256 key: refuse checkpoints (at start and reload) not signed with it",
    )
    checkpoint_key_file: Path | None = Field(
        None, description="a file holding the checkpoint key (e.g. a mounted secret)"
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
    ingest_overlap: bool = Field(
        True,
        description="advance a batch's states while its append runs in Redis (single log;"
        " the same states, less waiting: service/overlapped_advance.py)",
    )

    store_info_interval_s: float = Field(
        15.0,
        gt=0,
        description="how often /metrics refreshes the store's memory figures (one INFO each)",
    )
    model_poll_s: float = Field(
        1.0,
        gt=0,
        description="how often each worker reads the store's serving version; a reload"
        " reaches every worker within this plus one checkpoint load",
    )
    model_retry_s: float = Field(
        10.0,
        gt=0,
        description="a worker that failed to load the serving version retries after this",
    )
    model_behind_limit_s: float = Field(
        30.0,
        gt=0,
        description="a worker serving another version than the store's for longer than this reports not ready",
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

    # Live evaluation (service/live_eval.py): the service scores a sample of the events
    # it ingests, before they count, against negatives it draws itself.
    live_eval_rate: float = Field(
        0.01, ge=0.0, le=1.0, description="fraction of ingested events scored live (0 = off)"
    )
    live_eval_negatives: int = Field(
        9, ge=1, le=1000, description="K: random recently active destinations per live sample"
    )
    live_eval_window: int = Field(
        1000, ge=1, description="N: the live AP, AUC and MRR are over the last N samples"
    )
    live_eval_seed: int = Field(
        0, ge=0, description="which events are sampled and which negatives drawn (deterministic)"
    )
    live_eval_pool: int = Field(
        2000,
        ge=1,
        description="recently active destinations kept (with their state) to draw negatives from",
    )
    live_eval_queue: int = Field(
        64,
        ge=1,
        description="applied batches waiting for the evaluator; beyond it a batch is skipped",
    )
    live_eval_cpu_budget: float = Field(
        0.05,
        gt=0.0,
        description="share of one core the live evaluation may use on average; sampled events"
        " beyond it are skipped and counted (1 = no limit)",
    )
    live_eval_record: Path | None = Field(
        None, description="append every live sample and its scores to this file (JSON lines)"
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

    @model_validator(mode="after")
    def _one_checkpoint_key(self) -> Settings:
        if self.checkpoint_key is not None and self.checkpoint_key_file is not None:
            raise ValueError(
                "set DYGSERVE_CHECKPOINT_KEY or DYGSERVE_CHECKPOINT_KEY_FILE, not both"
            )
        return self

    def checkpoint_verify_key(self) -> bytes | None:
        """The key checkpoints must be signed with (model.signing), None = not checked."""
        if self.checkpoint_key is not None:
            return check_key(self.checkpoint_key.get_secret_value().encode())
        if self.checkpoint_key_file is not None:
            return check_key(self.checkpoint_key_file.read_bytes().strip())
        return None

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
