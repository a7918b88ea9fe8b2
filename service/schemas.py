"""Request and response models of the v1 wire contract (DESIGN "HTTP contract (v1)").

Unknown fields are refused (422); node ids are strings, JSON integers are accepted
and mean their decimal string; numbers must be finite.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictFloat, StrictInt

from model.node_ids import MAX_ID_BYTES


def _node_id(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError("a node id is a string or an integer")
    text = str(value)
    if not text:
        raise ValueError("a node id must not be empty")
    if len(text.encode("utf-8")) > MAX_ID_BYTES:
        raise ValueError(f"a node id is at most {MAX_ID_BYTES} bytes")
    return text


NodeId = Annotated[str, BeforeValidator(_node_id)]
Time = Annotated[StrictFloat | StrictInt, Field(allow_inf_nan=False)]
FiniteFloat = Annotated[StrictFloat | StrictInt, Field(allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EventIn(_Strict):
    src: NodeId
    dst: NodeId
    t: Time = Field(description="event time (seconds or the dataset's unit), float64")
    features: list[FiniteFloat] | None = Field(None, description="edge features; length fixed by the checkpoint")
    event_id: Annotated[str, Field(min_length=1, max_length=MAX_ID_BYTES)] | None = Field(
        None, description="client id for exactly-once retries"
    )


class EventsRequest(_Strict):
    events: list[EventIn]


class Rejected(BaseModel):
    index: int
    reason: str


class EventsResponse(BaseModel):
    accepted: int
    duplicates: int
    rejected: list[Rejected]
    applied: bool = Field(description="true when the states were committed before answering (wait=true)")


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


class ScoreDetail(PairScore):
    model_version: str
    src_state_age: float | None = Field(description="t minus the source's last event time; null if none")
    dst_state_age: float | None
    src_inductive: bool = Field(description="the source has no history: scored from the initial state")
    dst_inductive: bool
    clamped: bool = Field(description="t was earlier than an endpoint's last event and was clamped to it")


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


class ReloadRequest(_Strict):
    checkpoint: str = Field(description="checkpoint folder, relative to (or inside) the models directory")


class ModelInfo(BaseModel):
    model_version: str
    checkpoint: str
    config: dict
    metrics: dict
