"""Request and response models of the v1 wire contract (DESIGN "HTTP contract (v1)").

Unknown fields are refused (422); node ids are strings, JSON integers are accepted
and mean their decimal string; numbers must be finite.

Numbers: a JSON integer of any size arrives as a Python int and is converted to float64
first (one too large for float64 is refused, not a 500). Timestamps must lie within
+-MAX_ABS_TIME, so every time gap stays finite once scaled and cast to float32 (a gap
of ~1e41 dataset units made the time encoder, hence the node's state, NaN for good);
edge features must be finite as float32, the dtype the model reads them in. Ids
(node ids and event ids) are at most MAX_ID_BYTES bytes of UTF-8.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StrictFloat

from model.node_ids import MAX_ID_BYTES

MAX_ABS_TIME = 1e20  # |t| bound (ns since the epoch is ~1.8e18)
MAX_FEATURE = 3.4028234663852886e38  # float32 max: features are cast to float32

# Request limits of the contract, defined once: the service's defaults
# (``service/settings.py``, ``DYGSERVE_MAX_*``) and the Python client's (``service/client``).
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_BATCH_EVENTS = 10_000
DEFAULT_MAX_SCORE_PAIRS = 10_000


def _node_id(value: object) -> str:
    # Runs twice per ingested event (~2 us each without this fast path: 5% of an ingest).
    # An ASCII string (CPython knows without a scan) is as many bytes as characters and
    # holds no lone surrogate, so the common id needs no encoding to be checked.
    if type(value) is str and value.isascii() and 0 < len(value) <= MAX_ID_BYTES:
        return value
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError("a node id is a string or an integer")
    text = str(value)
    if not text:
        raise ValueError("a node id must not be empty")
    if len(text.encode("utf-8")) > MAX_ID_BYTES:
        raise ValueError(f"a node id is at most {MAX_ID_BYTES} bytes")
    return text


def _number(value: object) -> object:
    """JSON integers (any size) -> float64; one beyond float64 is a validation error."""
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            raise ValueError("number outside the float64 range") from None
    return value


def _id_bytes(value: str) -> str:
    if not value.isascii() and len(value.encode("utf-8")) > MAX_ID_BYTES:
        raise ValueError(f"an id is at most {MAX_ID_BYTES} bytes")
    return value


NodeId = Annotated[str, BeforeValidator(_node_id)]
# StrictFloat after _number: JSON integers are accepted (converted), booleans and strings are not.
Time = Annotated[
    StrictFloat,
    Field(allow_inf_nan=False, ge=-MAX_ABS_TIME, le=MAX_ABS_TIME),
    BeforeValidator(_number),
]
FiniteFloat = Annotated[
    StrictFloat,
    Field(allow_inf_nan=False, ge=-MAX_FEATURE, le=MAX_FEATURE),
    BeforeValidator(_number),
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EventIn(_Strict):
    src: NodeId
    dst: NodeId
    t: Time = Field(description="event time (seconds or the dataset's unit), float64")
    features: list[FiniteFloat] | None = Field(
        None, description="edge features; length fixed by the checkpoint"
    )
    event_id: (
        Annotated[str, Field(min_length=1, max_length=MAX_ID_BYTES), AfterValidator(_id_bytes)]
        | None
    ) = Field(None, description="client id for exactly-once retries")


class EventsRequest(_Strict):
    events: list[EventIn]


class ValidationIssue(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ErrorResponse(BaseModel):
    """Every 4xx/5xx of the v1 routes: a message, or the list of validation issues."""

    detail: str | list[ValidationIssue]


class Rejected(BaseModel):
    index: int
    reason: str


class EventsResponse(BaseModel):
    accepted: int
    duplicates: int
    rejected: list[Rejected]
    applied: bool = Field(
        description="true when the states were committed before answering (wait=true)"
    )


class PairIn(_Strict):
    src: NodeId
    dst: NodeId
    t: Time | None = None


class ScoreRequest(_Strict):
    pairs: list[PairIn]


class PairScore(BaseModel):
    src: str
    dst: str
    t: float
    probability: float
    logit: float


MAX_EXPLAIN_EVENTS = 100


class ExplainedEvent(BaseModel):
    """One past event of an endpoint and what it contributes to the logit."""

    t: float
    counterpart: str = Field(description="the event's other endpoint")
    role: Literal["src", "dst", "self"] = Field(
        description="the endpoint's role in the event (self: a self-loop)"
    )
    event_id: str | None
    seq: int = Field(description="the event's log sequence number")
    contribution: float = Field(
        description="first-order change of the logit owed to this event's term in the decayed state"
        " (gradient x input); see the README, 'Explaining a score'"
    )


class EndpointExplanation(BaseModel):
    node: str
    events: list[ExplainedEvent] = Field(
        description="the k events with the largest |contribution|, largest first"
    )
    events_in_state: int = Field(description="events in the node's state (its stored history)")
    total: float = Field(description="sum of the contributions of all events_in_state events")
    unexplained: float = Field(
        description="first-order share of the state that its stored history does not rebuild"
        " (0 up to rounding unless the history is capped)"
    )


class Explanation(BaseModel):
    method: str
    logit: float | None = Field(
        description="the logit recomputed along the way (equal to the score's); null for a model without state"
    )
    src: EndpointExplanation
    dst: EndpointExplanation


class ScoreDetail(PairScore):
    model_version: str
    src_state_age: float | None = Field(
        description="t minus the source's last event time; null if none"
    )
    dst_state_age: float | None
    src_inductive: bool = Field(
        description="the source has no history: scored from the initial state"
    )
    dst_inductive: bool
    clamped: bool = Field(
        description="t was earlier than an endpoint's last event and was clamped to it"
    )
    explanation: Explanation | None = Field(
        None, description="with explain=k: each endpoint's k past events that weigh most"
    )


class ScoreResponse(BaseModel):
    scores: list[PairScore]
    model_version: str


class RankRequest(_Strict):
    src: NodeId
    t: Time | None = None
    candidates: list[NodeId]


class Ranked(BaseModel):
    dst: str
    probability: float
    logit: float


class RankResponse(BaseModel):
    src: str
    t: float
    ranking: list[Ranked]
    model_version: str


class NodeSummary(BaseModel):
    node: str
    model_version: str
    cached: bool
    t_last: float | None
    events_applied: int
    last_seq: int | None
    history_length: int
    in_events: int | None = Field(
        None,
        description="its applied events as destination, from the role-count record the"
        " model keeps beside its state (null: the model keeps none, or not cached)",
    )
    out_events: int | None = Field(None, description="the same as source")
    last_in_t: float | None = Field(
        None, description="time of its latest applied event as destination (null: none)"
    )


class ReloadRequest(_Strict):
    checkpoint: str = Field(
        description="checkpoint folder, relative to (or inside) the models directory"
    )


class KernelInfo(BaseModel):
    path: str = Field(
        description="what advances node states: mamba-ssm (its fused kernels on CUDA),"
        " torch-cuda or torch-cpu (torch's rank-major path)"
    )
    reason: str = Field(description="why not the kernels (empty on the kernel path)")
    scoring_providers: list[str] | None = Field(
        description="onnxruntime providers the scoring graph really runs on (backend onnx)"
    )


class NodeHeadInfo(BaseModel):
    """The node-classification head of the serving checkpoint (``/v1/classify``)."""

    head_version: str = Field(description="the head's own version (config, weights, link model)")
    link_model_version: str = Field(description="the link model whose states it reads")
    task: str = Field(description="what the label means")
    label: str = Field(description="the dataset column it learned")
    event_feature_dim: int = Field(
        description="features a classify request must carry per node (0: none allowed)"
    )
    inputs: dict = Field(description="the head's input groups and widths")
    fine_tuned: bool = Field(
        description="the link model was fine-tuned with the head (else: a frozen base's)"
    )
    metrics: dict = Field(
        description="validation and test AUC-ROC / AP of the trainer (node_metrics.json), {} if none"
    )


class ModelInfo(BaseModel):
    model_version: str = Field(description="the version this worker serves")
    store_model_version: str | None = Field(
        description="the store's serving version, which every worker follows (null: not read yet)"
    )
    behind_store_s: float | None = Field(
        description="seconds this worker has served another version than the store's; null when it serves the store's"
    )
    replica: str = Field(description="the worker that answered: host and process id")
    checkpoint: str
    backend: str
    device: str = Field(description="where the model runs: cpu or cuda[:n]")
    kernels: KernelInfo
    config: dict
    metrics: dict
    node_head: NodeHeadInfo | None = Field(
        description="the node-classification head; null: none loaded, /v1/classify answers 404"
    )


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    ready: bool
    store: bool = Field(description="the state store answered a ping")
    model_version: str | None


# ----- node classification (checkpoints with a node head) -----------------------------
class NodeQueryIn(_Strict):
    node: NodeId
    t: Time | None = Field(None, description="query time; default: the latest event time seen")
    features: list[FiniteFloat] | None = Field(
        None,
        description="the classified event's features: required by a head trained with"
        " `--event-features` (`event_feature_dim` in the checkpoint's node_head.json),"
        " refused by any other",
    )


class ClassifyRequest(_Strict):
    nodes: list[NodeQueryIn]


class NodeClassification(BaseModel):
    node: str
    t: float
    probability: float = Field(description="probability that the node is in the labelled state")
    logit: float
    state_age: float = Field(description="t minus the node's last event time")
    clamped: bool = Field(description="t was earlier than the node's last event and was clamped")


class ClassifyDetail(NodeClassification):
    model_version: str = Field(description="the link model whose cached state was read")
    head_version: str = Field(description="the node-classification head")


class ClassifyResponse(BaseModel):
    scores: list[NodeClassification]
    model_version: str
    head_version: str
