"""Per-node recurrent state: a typed batch object and its binary blob format.

One blob per node and model version (DESIGN "State of one node"): the store's fixed
64-byte header (``state_store.blob_header``: magic, format version, shapes, model
version, the watermark t_last/last_seq, n_events), then::

    64     ...   h: n_layers x d_inner x d_state float32, then conv: n_layers x d_inner x (d_conv-1)
    ...    8 L   recent-neighbour keys (i64, oldest first, right-aligned, -1 = empty)
    ...    8 L   their event times (f64, +inf = empty)
    ...    120   with ``role_counts``: the role-count record (15 f64, model/role_counts.py)
    ...    4 B   with ``transition_buckets`` = B: the transition counts (f32,
                 model/transition_counts.py)
    ...    4 B+4 with ``transition_decay`` as well: the decayed counts and their total
    ...    258   with ``latest_transition_at_query``: the id of the node's newest neighbour
                 (u16 length in bytes, then its UTF-8, zero-padded to MAX_ID_BYTES; length
                 0: none), which a query needs to read that neighbour's record

L is the config's ``neighbour_list_len`` (also in header bytes 18..19). The neighbour
list is kept next to the state (DESIGN "The state of one node"), written by the same
compare-and-set as the state, so a query reads a node's state and its list with one
MGET and the list is exactly as of the state's watermark. Format 1 had no list. The
role-count record, where the model keeps one, travels with the list the same way; the
blob's size and the model version (which differs for such a model) tell a reader that
expects it from one that does not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from state_store.blob_header import (
    DTYPE_FLOAT32,
    FIXED_HEADER_END,
    FLAG_HAS_EVENTS,
    FLAGS_OFFSET,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    N_EVENTS_OFFSET,
    NO_SEQ,
    NO_TIME,
    WATERMARK_SEQ_OFFSET,
    WATERMARK_T_OFFSET,
)

from .config import ModelConfig
from .node_ids import MAX_ID_BYTES
from .role_counts import RECORD_WIDTH, advance_flat, empty_records
from .roles import ROLE_DST
from .transition_counts import (
    DenseTransitions,
    TransitionCounts,
    add_transitions,
    pair_keys,
    record_width,
)

STATE_FORMAT_VERSION = 2
# The newest neighbour's id field (ModelConfig.latest_transition_at_query): u16 length + id.
NEWEST_ID_FIELD_SIZE = 2 + MAX_ID_BYTES

PAD_KEY = -1  # an empty neighbour slot (node keys are 63-bit, never negative)


class StateFormatError(ValueError):
    """A blob that is not a state of this model (wrong magic, version, shapes or size)."""


@dataclass
class NodeStates:
    """States of N nodes, all layers stacked."""

    h: torch.Tensor  # (N, n_layers, d_inner, d_state) float32
    conv: torch.Tensor  # (N, n_layers, d_inner, d_conv - 1) float32
    t_last: torch.Tensor  # (N,) float64, NO_TIME for a node with no event
    last_seq: torch.Tensor  # (N,) int64
    n_events: torch.Tensor  # (N,) int64

    def __len__(self) -> int:
        return int(self.t_last.shape[0])

    @classmethod
    def initial(cls, n: int, config: ModelConfig) -> NodeStates:
        return cls(
            h=torch.zeros(n, config.n_layers, config.d_inner, config.d_state),
            conv=torch.zeros(n, config.n_layers, config.d_inner, config.d_conv - 1),
            t_last=torch.full((n,), NO_TIME, dtype=torch.float64),
            last_seq=torch.full((n,), NO_SEQ, dtype=torch.int64),
            n_events=torch.zeros(n, dtype=torch.int64),
        )

    def select(self, index: torch.Tensor | list[int]) -> NodeStates:
        idx = torch.as_tensor(index, dtype=torch.long)
        return NodeStates(
            self.h[idx], self.conv[idx], self.t_last[idx], self.last_seq[idx], self.n_events[idx]
        )

    @staticmethod
    def concat(parts: list[NodeStates]) -> NodeStates:
        return NodeStates(
            torch.cat([p.h for p in parts]),
            torch.cat([p.conv for p in parts]),
            torch.cat([p.t_last for p in parts]),
            torch.cat([p.last_seq for p in parts]),
            torch.cat([p.n_events for p in parts]),
        )

    def clone(self) -> NodeStates:
        return NodeStates(
            self.h.clone(),
            self.conv.clone(),
            self.t_last.clone(),
            self.last_seq.clone(),
            self.n_events.clone(),
        )

    def to(self, device: torch.device | str) -> NodeStates:
        if self.h.device == torch.device(device):
            return self  # the hot path on CPU: no per-tensor calls
        return NodeStates(
            *(x.to(device) for x in (self.h, self.conv, self.t_last, self.last_seq, self.n_events))
        )

    @property
    def has_events(self) -> torch.Tensor:
        return self.n_events > 0


@dataclass
class NeighbourLists:
    """Recent neighbours of N nodes: keys (N, L) int64 (PAD_KEY = empty), times float64
    (+inf = empty); oldest first, right-aligned (the newest entry is the last column).
    ``records``: the nodes' role-count records (N, RECORD_WIDTH) float64 where the model
    keeps them (``ModelConfig.role_counts``), else None; ``transitions`` likewise their
    transition counts (``ModelConfig.transition_buckets``, model/transition_counts.py)."""

    keys: torch.Tensor
    times: torch.Tensor
    records: torch.Tensor | None = None
    transitions: TransitionCounts | None = None

    @classmethod
    def empty(
        cls,
        n: int,
        length: int,
        role_counts: bool = False,
        transition_buckets: int = 0,
        transition_decay: float = 0.0,
        transition_order2: bool = False,
    ) -> NeighbourLists:
        return cls(
            torch.full((n, length), PAD_KEY, dtype=torch.int64),
            torch.full((n, length), np.inf, dtype=torch.float64),
            torch.from_numpy(empty_records(n)) if role_counts else None,
            DenseTransitions.empty(n, transition_buckets, transition_decay, transition_order2)
            if transition_buckets
            else None,
        )

    @classmethod
    def empty_for(cls, n: int, config: ModelConfig) -> NeighbourLists:
        """Empty lists with the records ``config`` keeps."""
        return cls.empty(
            n,
            config.neighbour_list_len,
            config.role_counts,
            config.transition_buckets,
            config.transition_decay,
            config.transition_order2,
        )

    def assign(self, rows: torch.Tensor, other: NeighbourLists) -> None:
        """Overwrite rows ``rows`` with ``other``'s rows, in place."""
        self.keys[rows], self.times[rows] = other.keys, other.times
        if self.records is not None:
            assert other.records is not None, "role-count records missing"
            self.records[rows] = other.records
        if self.transitions is not None:
            assert isinstance(self.transitions, DenseTransitions)
            assert isinstance(other.transitions, DenseTransitions), "transition counts missing"
            self.transitions.counts[rows.numpy()] = other.transitions.counts

    @classmethod
    def from_lists(
        cls, keys: Sequence[Sequence[int]], times: Sequence[Sequence[float]], length: int
    ) -> NeighbourLists:
        n = len(keys)
        k = np.full((n, length), PAD_KEY, dtype=np.int64)
        t = np.full((n, length), np.inf, dtype=np.float64)
        for i, (ki, ti) in enumerate(zip(keys, times, strict=True)):
            ki, ti = list(ki)[-length:], list(ti)[-length:]
            if ki:
                k[i, length - len(ki) :] = ki
                t[i, length - len(ti) :] = ti
        return cls(torch.from_numpy(k), torch.from_numpy(t))

    def select(self, index: torch.Tensor | list[int]) -> NeighbourLists:
        idx = torch.as_tensor(index, dtype=torch.long)
        records = None if self.records is None else self.records[idx]
        transitions = None if self.transitions is None else self.transitions.select(idx.numpy())
        return NeighbourLists(self.keys[idx], self.times[idx], records, transitions)

    def to(self, device: torch.device | str) -> NeighbourLists:
        if self.keys.device == torch.device(device):
            return self
        records = None if self.records is None else self.records.to(device)
        return NeighbourLists(
            self.keys.to(device), self.times.to(device), records, self.transitions
        )

    def extended(
        self,
        per_node: Sequence[Sequence[Any]],
        previous: Sequence[Sequence[int]] | None = None,
        previous2: Sequence[Sequence[int]] | None = None,
    ) -> NeighbourLists:
        """The lists after appending each node's new entries (objects with ``other_key``,
        ``t`` and ``role``, oldest first): the last L of old + new, vectorised over
        nodes; the role-count records, where kept, advanced over the same entries, and
        the transition counts, where kept, with ``previous``: per entry, the key of the
        other endpoint's previous neighbour (``transition_counts.PAD``: none), and for
        second-order records ``previous2``, the neighbour before that one."""
        n, length = self.keys.shape
        counts = np.fromiter((len(e) for e in per_node), dtype=np.int64, count=n)
        total = int(counts.sum())
        flat = [e for events in per_node for e in events]
        rows = np.repeat(np.arange(n), counts)
        t = np.fromiter((e.t for e in flat), dtype=np.float64, count=total)
        records = None
        if self.records is not None:
            is_in = np.fromiter((e.role == ROLE_DST for e in flat), dtype=bool, count=total)
            records = torch.from_numpy(advance_flat(self.records.numpy(), rows, t, is_in))
        transitions = None
        if self.transitions is not None:
            if previous is None:
                raise ValueError("these lists keep transition counts: pass previous neighbours")
            assert isinstance(self.transitions, DenseTransitions)
            prev = np.fromiter((k for keys in previous for k in keys), dtype=np.int64, count=total)
            old = self.transitions
            newest = self.times[:, -1].numpy() if length else np.full(n, np.inf)
            record = np.array(old.counts, dtype=np.float32, copy=True)  # the lists are values
            pairs = None
            if previous2 is not None:
                prev2 = np.fromiter(
                    (k for ks in previous2 for k in ks), dtype=np.int64, count=total
                )
                pairs = pair_keys(prev2, prev)
            add_transitions(record, rows, prev, old.buckets, old.decay, t, newest, pairs)
            transitions = old.like(record)
        if total == 0:
            return NeighbourLists(self.keys.clone(), self.times.clone(), records, transitions)
        width = length + int(counts.max())
        keys = np.full((n, width), PAD_KEY, dtype=np.int64)
        times = np.full((n, width), np.inf, dtype=np.float64)
        keys[:, :length] = self.keys.numpy()
        times[:, :length] = self.times.numpy()
        cols = length + np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
        keys[rows, cols] = [e.other_key for e in flat]
        times[rows, cols] = t
        take = (
            counts[:, None] + np.arange(length)[None, :]
        )  # the last L of row i: n_i .. n_i + L - 1
        return NeighbourLists(
            torch.from_numpy(np.take_along_axis(keys, take, 1)),
            torch.from_numpy(np.take_along_axis(times, take, 1)),
            records,
            transitions,
        )


class StateCodec:
    """Encodes and decodes node-state blobs for one model config and version."""

    def __init__(self, config: ModelConfig, model_version: str) -> None:
        if len(model_version) != 16:
            raise ValueError("model_version must be 16 hex digits")
        self.config = config
        self.model_version = model_version
        self._version_bytes = bytes.fromhex(model_version)
        self._h_shape = (config.n_layers, config.d_inner, config.d_state)
        self._conv_shape = (config.n_layers, config.d_inner, config.d_conv - 1)
        self._h_size = int(np.prod(self._h_shape))
        self._conv_size = int(np.prod(self._conv_shape))
        self.list_len = config.neighbour_list_len
        self.role_counts = config.role_counts
        self._arrays_size = 4 * (self._h_size + self._conv_size)
        self._records_size = 8 * RECORD_WIDTH if self.role_counts else 0
        self.transition_buckets = config.transition_buckets
        self.transition_decay = config.transition_decay
        self.keeps_newest_id = config.latest_transition_at_query
        self._newest_id_size = NEWEST_ID_FIELD_SIZE if self.keeps_newest_id else 0
        self.blob_size = (
            HEADER_SIZE
            + self._arrays_size
            + 16 * self.list_len
            + self._records_size
            + 4
            * record_width(self.transition_buckets, self.transition_decay, config.transition_order2)
            + self._newest_id_size
        )
        self._shape_fields = (
            MAGIC,
            STATE_FORMAT_VERSION,
            DTYPE_FLOAT32,
            config.n_layers,
            config.d_state,
            config.d_inner,
            config.d_conv,
            self.list_len,
            self._version_bytes,
        )
        self._fixed_header = np.frombuffer(
            self._header(0.0, 0, 0)[:FIXED_HEADER_END], dtype=np.uint8
        )

    def _header(self, t_last: float, seq: int, n_events: int) -> bytes:
        magic, version, dtype, n_layers, d_state, d_inner, d_conv, list_len, mv = self._shape_fields
        flags = FLAG_HAS_EVENTS if n_events > 0 else 0
        return HEADER.pack(
            magic,
            version,
            dtype,
            flags,
            n_layers,
            d_state,
            d_inner,
            d_conv,
            list_len,
            mv,
            t_last,
            seq,
            n_events,
        )

    def encode_many(
        self,
        states: NodeStates,
        lists: NeighbourLists | None = None,
        newest_ids: Sequence[str] | None = None,
    ) -> list[bytes]:
        """One blob per node (``lists`` None: empty neighbour lists), in one numpy pass;
        ``newest_ids``: each node's newest neighbour ("": none), for a codec that keeps
        them (``latest_transition_at_query``; None there: none for every node)."""
        n = len(states)
        if lists is None:
            lists = NeighbourLists.empty_for(n, self.config)
        if tuple(lists.keys.shape) != (n, self.list_len):
            raise ValueError(
                f"neighbour lists of shape {tuple(lists.keys.shape)}, expected {(n, self.list_len)}"
            )
        if (lists.records is not None) != self.role_counts:
            raise ValueError("role-count records are kept exactly when the model has role_counts")
        parts = [
            states.h.detach().to(torch.float32).contiguous().numpy().reshape(n, -1),
            states.conv.detach().to(torch.float32).contiguous().numpy().reshape(n, -1),
            lists.keys.to(torch.int64).contiguous().numpy(),
            lists.times.to(torch.float64).contiguous().numpy(),
        ]
        if lists.records is not None:
            parts.append(lists.records.to(torch.float64).contiguous().numpy())
        if self.transition_buckets:
            if not isinstance(lists.transitions, DenseTransitions):
                raise ValueError("this model keeps transition counts: the lists must carry them")
            parts.append(np.ascontiguousarray(lists.transitions.counts, dtype=np.float32))
        if self.keeps_newest_id:
            parts.append(_newest_id_field(newest_ids if newest_ids is not None else [""] * n))
        elif newest_ids is not None:
            raise ValueError("this model keeps no newest-neighbour ids")
        body = np.concatenate([p.view(np.uint8).reshape(n, -1) for p in parts], axis=1)
        t = states.t_last.tolist()
        s = states.last_seq.tolist()
        c = states.n_events.tolist()
        return [self._header(t[i], s[i], c[i]) + body[i].tobytes() for i in range(n)]

    def check_header(self, blob: bytes) -> tuple[float, int, int]:
        """Validate a blob's header against this codec; return (t_last, last_seq, n_events)."""
        if len(blob) != self.blob_size:
            raise StateFormatError(f"state blob has {len(blob)} bytes, expected {self.blob_size}")
        fields = HEADER.unpack_from(blob)
        (
            magic,
            version,
            dtype,
            _flags,
            n_layers,
            d_state,
            d_inner,
            d_conv,
            list_len,
            mv,
            t,
            seq,
            cnt,
        ) = fields
        if magic != MAGIC:
            raise StateFormatError("not a dygserve state blob (bad magic)")
        if version != STATE_FORMAT_VERSION:
            raise StateFormatError(
                f"state format {version}, this code reads {STATE_FORMAT_VERSION}"
            )
        if (dtype, n_layers, d_state, d_inner, d_conv, list_len) != (
            DTYPE_FLOAT32,
            *self._shape_fields[3:8],
        ):
            raise StateFormatError("state blob shapes do not match the model config")
        if mv != self._version_bytes:
            raise StateFormatError(
                f"state blob belongs to model {mv.hex()}, not {self.model_version}"
            )
        return t, seq, cnt

    def _checked_rows(self, blobs: list[bytes]) -> np.ndarray:
        """The blobs as rows of one uint8 array, every header validated.

        The fixed header bytes (all but the flags and the watermark) are compared for
        all rows in one numpy pass; only when some row differs does ``check_header``
        run per blob, to name what is wrong.
        """
        size = self.blob_size
        if all(len(b) == size for b in blobs):
            raw = np.frombuffer(b"".join(blobs), dtype=np.uint8).reshape(len(blobs), size)
            fixed = self._fixed_header
            if (raw[:, :FLAGS_OFFSET] == fixed[:FLAGS_OFFSET]).all() and (
                raw[:, FLAGS_OFFSET + 1 : FIXED_HEADER_END] == fixed[FLAGS_OFFSET + 1 :]
            ).all():
                return raw
        for b in blobs:
            self.check_header(b)
        raise AssertionError(
            "unreachable: a header differs but check_header accepted it"
        )  # pragma: no cover

    def decode_many(self, blobs: list[bytes]) -> NodeStates:
        return self.decode_with_neighbours(blobs)[0]

    def decode_with_neighbours(self, blobs: list[bytes]) -> tuple[NodeStates, NeighbourLists]:
        """States and neighbour lists of blobs, headers validated, arrays in one pass."""
        n = len(blobs)
        if n == 0:
            empty = NeighbourLists.empty_for(0, self.config)
            return NodeStates.initial(0, self.config), empty
        raw = self._checked_rows(blobs)

        def field(lo: int, hi: int, dtype: type) -> torch.Tensor:
            # One copy into a fresh writable array (the rows view the read-only blobs).
            return torch.from_numpy(raw[:, lo:hi].copy().view(dtype))

        h_end = HEADER_SIZE + 4 * self._h_size
        start = HEADER_SIZE + self._arrays_size
        states = NodeStates(
            h=field(HEADER_SIZE, h_end, np.float32).reshape(n, *self._h_shape),
            conv=field(h_end, start, np.float32).reshape(n, *self._conv_shape),
            t_last=field(WATERMARK_T_OFFSET, WATERMARK_T_OFFSET + 8, np.float64).reshape(n),
            last_seq=field(WATERMARK_SEQ_OFFSET, WATERMARK_SEQ_OFFSET + 8, np.int64).reshape(n),
            n_events=field(N_EVENTS_OFFSET, N_EVENTS_OFFSET + 8, np.int64).reshape(n),
        )
        times_at, records_at = start + 8 * self.list_len, start + 16 * self.list_len
        keys = raw[:, start:times_at].copy().view(np.int64)
        times = raw[:, times_at:records_at].copy().view(np.float64)
        records = transitions = None
        counts_at = records_at + self._records_size
        if self.role_counts:
            records = torch.from_numpy(raw[:, records_at:counts_at].copy().view(np.float64))
        if self.transition_buckets:
            transitions = DenseTransitions(
                raw[:, counts_at : self.blob_size - self._newest_id_size].copy().view(np.float32),
                self.transition_buckets,
                self.transition_decay,
            )
        return states, NeighbourLists(
            torch.from_numpy(keys), torch.from_numpy(times), records, transitions
        )

    def newest_ids(self, blobs: Sequence[bytes | None]) -> list[str]:
        """Each blob's newest-neighbour id ("" where none, or for no blob), for a codec
        that keeps them (``latest_transition_at_query``). Headers are not checked here:
        the caller decodes the same blobs."""
        if not self.keeps_newest_id:
            raise ValueError("this model keeps no newest-neighbour ids")
        at = self.blob_size - NEWEST_ID_FIELD_SIZE
        out = []
        for b in blobs:
            if b is None:
                out.append("")
                continue
            size = int.from_bytes(b[at : at + 2], "little")
            out.append(b[at + 2 : at + 2 + size].decode("utf-8"))
        return out


def _newest_id_field(ids: Sequence[str]) -> np.ndarray:
    """(N, NEWEST_ID_FIELD_SIZE) uint8: each id as u16 length + UTF-8, zero-padded."""
    out = np.zeros((len(ids), NEWEST_ID_FIELD_SIZE), dtype=np.uint8)
    for i, node in enumerate(ids):
        raw = node.encode("utf-8")
        if len(raw) > MAX_ID_BYTES:
            raise ValueError(f"node id of {len(raw)} bytes (at most {MAX_ID_BYTES})")
        out[i, :2] = np.frombuffer(len(raw).to_bytes(2, "little"), dtype=np.uint8)
        out[i, 2 : 2 + len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    return out
