"""One typed config per store backend (after Feast's online-store configs).

``StoreOptions`` are the rules every backend keeps (history cap, dedupe window, state
TTL, future skew, log retention); each backend's config adds what only it needs. The
``backend`` field tells them apart, so a ``StoreConfig`` parses from one JSON object
or environment block (the service nests it in its Settings).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# For a new cluster deployment: 3 to 8 masters each get an even share, and a batch of
# 1,000 events still gives each partition's script dozens of entries.
RECOMMENDED_CLUSTER_PARTITIONS = 16


class StoreOptions(BaseModel):
    """Options every backend understands."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    state_ttl_s: float | None = Field(
        None, gt=0, description="TTL of state blobs (the only keys with a TTL); None = none"
    )
    history_cap: int = Field(
        10_000, ge=1, description="events kept per node history (newest); older are dropped"
    )
    dedupe_ttl_s: float | None = Field(
        7 * 86_400.0, gt=0, description="how long an event id is remembered; None = forever"
    )
    max_future_skew: float | None = Field(
        None, ge=0, description="refuse t > latest logged t + this; None = off"
    )
    log_keep: int = Field(
        100_000, ge=0, description="the global log always keeps at least this many newest entries"
    )


class MemoryStoreConfig(StoreOptions):
    """The embedded in-process store (one process, not persistent)."""

    backend: Literal["memory"] = "memory"


class RedisStoreConfig(StoreOptions):
    """``redis://host:port/db`` (one server, also ``rediss://``, ``unix://``) or
    ``redis+cluster://host:port[,host:port...]`` (Redis Cluster, also ``rediss+cluster://``)."""

    backend: Literal["redis"] = "redis"
    url: str = "redis://127.0.0.1:6379/0"
    socket_timeout: float | None = Field(5.0, gt=0)
    key_prefix: str = Field(
        "dygserve",
        min_length=1,
        description="namespace of every key (several deployments per Redis)",
    )
    script_slice: int = Field(
        0,
        ge=0,
        description=(
            "single-slot log only: at most this many events per append script call and "
            "blobs per compare-and-set call, sent one after another (0 = the whole batch "
            "in one call). Redis runs one script at a time, so a read that arrives during "
            "an ingest's script waits for all of it: slices bound that wait at one round "
            "trip per slice (docs/STATE_STORE.md, 'Script slices')"
        ),
    )
    partitions: int | None = Field(
        None,
        ge=1,
        le=1024,
        description=(
            "log partitions P (fixed per deployment, recorded in the store's meta key): "
            "None = 1 (the single-slot layout, on one server and on a cluster); 16 is "
            "the recommended value for a new cluster deployment, so that the log, "
            "histories, dedupe ids and pending entries spread over its masters "
            "(docs/STATE_STORE.md, 'Partitioned log')"
        ),
    )
    doubt_timeout_s: float = Field(
        10.0,
        gt=0,
        description=(
            "partitioned log only: an event logged in one of its two partitions and not "
            "the other for this long is decided by the re-drive (committed if both copies "
            "exist, else fenced and aborted)"
        ),
    )

    @model_validator(mode="after")
    def _slices_on_the_single_slot_log(self) -> RedisStoreConfig:
        if self.script_slice and self.partition_count > 1:
            raise ValueError(
                "script_slice applies to the single-slot log only: a partitioned log "
                "(partitions > 1) already appends per partition; unset one of them"
            )
        return self

    @property
    def partition_count(self) -> int:
        """``partitions``, or 1 when unset, on a cluster too: a deployment that upgrades
        keeps its single-slot store (a default of 16 would make every existing cluster
        deployment refuse to start). New cluster deployments set
        ``RECOMMENDED_CLUSTER_PARTITIONS`` (the compose file's cluster profile does)."""
        return self.partitions or 1


StoreConfig = Annotated[MemoryStoreConfig | RedisStoreConfig, Field(discriminator="backend")]
