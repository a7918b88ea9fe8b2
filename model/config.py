"""Model configuration: everything that fixes the shapes and semantics of a checkpoint.

The config is saved as ``config.json`` beside ``weights.safetensors``. Fields that
are *fitted* on the training split (the time normalisation) live here too, so a
checkpoint is self-contained and the serve path never looks at training data.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

TimeEncoderKind = Literal["linear", "sinusoidal", "both"]

# The floor of an event's decay step (see ``ModelConfig.delta_min``). A zero-gap event
# then decays the state by exp(A * 1e-4): at most 0.16% for the S4D init's largest
# |A| = 16, while the kernel input u = Delta_in * x / Delta stays within 1e4 * |Delta_in * x|,
# far inside float32's range.
DEFAULT_DELTA_MIN = 1e-4


class TimeNormalisation(BaseModel):
    """How a raw time span (gap, in the dataset's unit) is standardised.

    ``scale`` is the unit of the decay step (Delta_dec = softplus(lam) * gap / scale).
    ``log_mean``/``log_std`` standardise ``log1p(gap / scale)`` for the linear encoder:
    gaps are heavy-tailed, so standardising the raw gap would squash almost every
    event to the same value.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    scale: float = Field(1.0, gt=0)
    log_mean: float = 0.0
    log_std: float = Field(1.0, gt=0)


class ModelConfig(BaseModel):
    """Shapes and choices of the causal DyG-Mamba node encoder and link head."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    edge_feature_dim: int = Field(0, ge=0, description="length of each event's feature vector")
    d_model: int = Field(32, ge=4, description="width of the token / residual stream")
    expand: int = Field(2, ge=1)
    d_state: int = Field(16, ge=1)
    d_conv: int = Field(4, ge=1, description="causal depthwise conv kernel over event index")
    n_layers: int = Field(1, ge=1)
    time_encoder: TimeEncoderKind = "both"
    d_time: int = Field(16, ge=1)
    node_hash_buckets: int = Field(
        1024, ge=0, description="hashed embedding of the other endpoint's id (0 = off)"
    )
    d_node: int = Field(16, ge=1)
    neighbour_list_len: int = Field(32, ge=1, description="L: recent neighbours kept per node")
    d_out: int = Field(32, ge=1, description="width of a node's read-out vector")
    identity_match_dim: int = Field(
        0,
        ge=0,
        description="width of the learned match between each endpoint's hashed id and the other"
        " endpoint's latest neighbours (0 = off); needs node_hash_buckets",
    )
    identity_match_depth: int = Field(
        1, ge=1, description="how many of the other endpoint's latest neighbours it matches"
    )
    head_hidden: int = Field(64, ge=1)
    use_state: bool = Field(True, description="ablation switch: SSM node states in the head")
    use_pair_features: bool = Field(True, description="ablation switch: pair/activity features")
    snapshot_pair_features: bool = Field(
        False,
        description="four more pair features: each endpoint's visible list entries at the query"
        " time and at its previous distinct time (the snapshot so far and the last one; the"
        " trainer turns it on for snapshot streams under batch visibility)",
    )
    role_counts: bool = Field(
        False,
        description="ten more pair features per endpoint from a record kept beside its"
        " neighbour list: its in- and out-events in the query's snapshot so far, the one"
        " before, the three before and all earlier ones, and the time since it was last a"
        " destination (model/role_counts.py; the trainer turns it on for snapshot streams"
        " under batch visibility)",
    )
    role_count_unit: float = Field(
        1.0,
        gt=0,
        description="length of one snapshot for the role counts, in the stream's time units"
        " (the trainer picks the median spacing of the training snapshots)",
    )
    transition_buckets: int = Field(
        0,
        ge=0,
        description="hashed buckets of a per-node record of where its counterparts came from"
        " (each event adds one at the bucket of the other endpoint's previous neighbour), read"
        " at the other endpoint's latest neighbours: the online 'what follows what' table,"
        " kept per node (model/transition_counts.py; 0 = off)",
    )
    transition_decay: float = Field(
        0.0,
        ge=0.0,
        description="with transition_buckets: time constant T of a second, decayed row of the"
        " transition counts (each count weighted by exp(-age / T)), read beside the raw one"
        " (model/transition_counts.py; 0 = off)",
    )
    transition_order2: bool = Field(
        False,
        description="with transition_buckets: a second record of the same shape that counts"
        " where the counterparts came from two steps back (the pair of their two previous"
        " neighbours), read at the other endpoint's latest pair (model/transition_counts.py)",
    )
    latest_transition_count: bool = Field(
        False,
        description="EXPERIMENT (kept from the event, trainer and evaluator only: the service"
        " refuses it, its writers cannot keep it; served with latest_transition_at_query):"
        " with transition_buckets, each node also keeps how often"
        " its latest transition had been made before it made it (its latest neighbour's"
        " transition count at the bucket of the neighbour before that, as that record stood"
        " before the event), read for both endpoints (model/transition_counts.py)",
    )
    latest_transition_at_query: bool = Field(
        False,
        description="with latest_transition_count (the trainer turns both on for bipartite"
        " streams in continuous time): read the latest transition"
        " count at the query instead of keeping it from the event: the node's newest"
        " neighbour l1's raw transition count at the bucket of the neighbour before it (l2),"
        " from l1's record as it stands when the node is scored. Writers keep only l1's id"
        " in the blob; the service serves it with a second read, for l1's record"
        " (docs/STATE_STORE.md, 'The latest transition count, read at the query')",
    )
    time_norm: TimeNormalisation = TimeNormalisation()
    delta_min: float = Field(
        DEFAULT_DELTA_MIN,
        ge=0.0,
        le=1.0,
        description="floor of an event's decay step Delta = clamp(softplus(lam) * gap / scale,"
        " delta_min, Delta_max): with delta_min > 0 a zero-gap event's input can be written"
        " as mamba's Delta * B * u with u = Delta_in * x / Delta, so the fused kernels compute"
        " this model exactly. 0 = no floor (checkpoints saved before the field existed load"
        " with 0: model.checkpoint.LEGACY_CONFIG_DEFAULTS); such a checkpoint cannot run"
        " mamba-ssm's kernels",
    )

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    @model_validator(mode="after")
    def _something_to_score(self) -> ModelConfig:
        if not (self.use_state or self.use_pair_features):
            raise ValueError("at least one of use_state / use_pair_features must be on")
        if self.role_counts and not self.use_pair_features:
            raise ValueError("role_counts are pair features: they need use_pair_features")
        if self.transition_buckets and not self.use_pair_features:
            raise ValueError("transition counts are pair features: they need use_pair_features")
        if self.transition_decay and not self.transition_buckets:
            raise ValueError("transition_decay decays the transition counts: it needs them")
        if self.transition_order2 and not self.transition_buckets:
            raise ValueError("transition_order2 is a second transition record: it needs the first")
        if self.latest_transition_count and not self.transition_buckets:
            raise ValueError("latest_transition_count reads transition records: it needs them")
        if self.latest_transition_at_query and not self.latest_transition_count:
            raise ValueError("latest_transition_at_query says how to read latest_transition_count")
        if (self.transition_order2 or self.latest_transition_at_query) and (
            self.neighbour_list_len < 2
        ):
            raise ValueError("this config reads a node's two latest neighbours: lists of 2+")
        if self.identity_match_dim and not self.node_hash_buckets:
            raise ValueError(
                "identity_match_dim needs node_hash_buckets > 0 (the match hashes node ids)"
            )
        return self

    def with_updates(self, **changes: object) -> ModelConfig:
        """A validated copy with some fields changed (model_copy skips validation)."""
        return ModelConfig.model_validate({**self.model_dump(), **changes})
