"""A real-model ``advance`` for the exactly-once applier, and UCI events, for tests.

``ModelAdvance`` is the service's own advance function (``ModelRuntime.advance_blobs``)
on a tiny model, so the store tests exercise exactly what the service runs.
"""

from __future__ import annotations

import csv
import gzip
import os
from pathlib import Path

import torch

from model.checkpoint import LoadedCheckpoint
from model.config import ModelConfig, TimeNormalisation
from model.link_model import DygMambaLinkModel
from model.node_state import StateCodec
from service.engine import ModelRuntime
from state_store.base import LoggedEvent, NewEvent, StateStore

VERSION = "00c0ffee00c0ffee"
SEED = 1234
REPO = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("DYGSERVE_DATA", REPO.parent / "shared" / "data"))
UCI = DATA / "uci" / "edges.csv.gz"


def tiny_config(edge_feature_dim: int = 0) -> ModelConfig:
    return ModelConfig(
        edge_feature_dim=edge_feature_dim,
        d_model=8,
        d_state=4,
        n_layers=1,
        node_hash_buckets=16,
        d_node=4,
        d_time=4,
        d_out=8,
        head_hidden=8,
        time_norm=TimeNormalisation(scale=86_400.0),
    )


def build_model(config: ModelConfig | None = None, seed: int = SEED) -> DygMambaLinkModel:
    torch.manual_seed(seed)
    return DygMambaLinkModel(config or tiny_config()).eval()


class ModelAdvance:
    """The applier's ``advance`` on the real model: the service's own
    ``ModelRuntime.advance_blobs`` (decode, ``model.streaming.advance``, encode),
    counting its calls."""

    def __init__(self, model: DygMambaLinkModel, version: str = VERSION) -> None:
        self.model = model
        self.config = model.config
        self.runtime = ModelRuntime(LoadedCheckpoint(Path("."), model.config, model, version, {}))
        self.codec = self.runtime.codec
        self.calls = 0

    def __call__(
        self, nodes: list[str], blobs: list[bytes | None], new_events: list[list[LoggedEvent]]
    ) -> dict[str, bytes]:
        self.calls += 1
        return self.runtime.advance_blobs(nodes, blobs, new_events)


def uci_events(n_rows: int, path: Path = UCI) -> list[NewEvent]:
    """The first ``n_rows`` UCI interactions, with stable event ids."""
    out = []
    with gzip.open(path, "rt", newline="") as fh:
        for i, row in enumerate(csv.DictReader(fh)):
            if i >= n_rows:
                break
            out.append(
                NewEvent(src=row["src"], dst=row["dst"], t=float(row["ts"]), event_id=f"uci-{i}")
            )
    return out


def max_state_diff(codec: StateCodec, a: list[bytes | None], b: list[bytes | None]) -> float:
    """Max abs difference of two lists of blobs (h and conv); inf if presence or
    watermark/count differ."""
    if [x is None for x in a] != [x is None for x in b]:
        return float("inf")
    pa = [x for x in a if x is not None]
    pb = [x for x in b if x is not None]
    if not pa:
        return 0.0
    sa, sb = codec.decode_many(pa), codec.decode_many(pb)  # type: ignore[arg-type]
    if not (
        torch.equal(sa.t_last, sb.t_last)
        and torch.equal(sa.last_seq, sb.last_seq)
        and torch.equal(sa.n_events, sb.n_events)
    ):
        return float("inf")
    return max(float((sa.h - sb.h).abs().max()), float((sa.conv - sb.conv).abs().max()))


def read_whole_log(store: StateStore) -> list[LoggedEvent]:
    """Every event of the store's log, oldest first, page by page."""
    out: list[LoggedEvent] = []
    while True:
        page = store.read_log(out[-1].seq if out else -1, 5000)
        if not page:
            return out
        out += page
