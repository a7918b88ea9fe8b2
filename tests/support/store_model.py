"""A real-model ``advance`` for the exactly-once applier, and UCI events, for tests.

``ModelAdvance`` decodes the blobs (None = the initial state), builds each node's
``EventInputs`` from its new ``LoggedEvent``s (other endpoint's key, role 0 for the
source / 1 for the destination, features, t, seq) and runs ``DygMambaLinkModel.scan``
over all nodes at once (padded), then encodes the final states.
"""

from __future__ import annotations

import csv
import gzip
import os
from pathlib import Path

import numpy as np
import torch

from model.config import ModelConfig, TimeNormalisation
from model.link_model import ROLE_DST, ROLE_SRC, DygMambaLinkModel, EventInputs
from model.node_ids import node_key
from model.node_state import NodeStates, StateCodec
from state_store.base import LoggedEvent, NewEvent

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
    """The applier's ``advance`` on the real model (batch scan over new events)."""

    def __init__(self, model: DygMambaLinkModel, version: str = VERSION) -> None:
        self.model = model
        self.config = model.config
        self.codec = StateCodec(model.config, version)
        self.calls = 0

    def __call__(
        self, nodes: list[str], blobs: list[bytes | None], new_events: list[list[LoggedEvent]]
    ) -> dict[str, bytes]:
        self.calls += 1
        n = len(nodes)
        states = NodeStates.initial(n, self.config)
        warm = [i for i, b in enumerate(blobs) if b is not None]
        if warm:
            dec = self.codec.decode_many([blobs[i] for i in warm])  # type: ignore[misc]
            idx = torch.tensor(warm)
            states.h[idx], states.conv[idx] = dec.h, dec.conv
            states.t_last[idx], states.last_seq[idx], states.n_events[idx] = (
                dec.t_last,
                dec.last_seq,
                dec.n_events,
            )
        lengths = torch.tensor([len(e) for e in new_events], dtype=torch.long)
        t_len = max(1, int(lengths.max()) if n else 1)
        f_dim = self.config.edge_feature_dim
        other = np.zeros((n, t_len), dtype=np.int64)
        role = np.zeros((n, t_len), dtype=np.int64)
        feats = np.zeros((n, t_len, f_dim), dtype=np.float32)
        t = np.zeros((n, t_len), dtype=np.float64)
        seq = np.zeros((n, t_len), dtype=np.int64)
        for i, (node, evs) in enumerate(zip(nodes, new_events, strict=True)):
            for j, e in enumerate(evs):
                is_src = e.src == node
                other[i, j] = node_key(e.dst if is_src else e.src)
                role[i, j] = ROLE_SRC if is_src else ROLE_DST
                if f_dim:
                    feats[i, j] = e.features
                t[i, j] = e.t
                seq[i, j] = e.seq
            if evs:  # pad with the last time: zero gaps past the end
                t[i, len(evs) :] = evs[-1].t
                seq[i, len(evs) :] = evs[-1].seq
        ev = EventInputs(
            other_key=torch.from_numpy(other),
            role=torch.from_numpy(role),
            features=torch.from_numpy(feats),
            t=torch.from_numpy(t),
            seq=torch.from_numpy(seq),
        )
        with torch.no_grad():
            final, _ = self.model.scan(states, ev, lengths)
        return dict(zip(nodes, self.codec.encode_many(final), strict=True))


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
