"""Per-node recurrent state: a typed batch object and its binary blob format.

One blob per node and model version (DESIGN "State of one node")::

    offset size  field
    0      4     magic b"DYGS"
    4      2     STATE_FORMAT_VERSION (u16)
    6      1     dtype code (1 = float32)
    7      1     flags (bit 0: the node has applied at least one event)
    8      2     n_layers (u16)
    10     2     d_state (u16)
    12     4     d_inner (u32)
    16     2     d_conv (u16)
    18     2     reserved
    20     8     model version (the 16 hex digits as 8 raw bytes)
    28     4     reserved (aligns the watermark to 8 bytes)
    32     8     t_last (f64): time of the last applied event   -- watermark
    40     8     last_seq (i64): log sequence of that event      -- watermark
    48     8     n_events (i64): number of applied events
    56     8     reserved
    64     ...   h: n_layers x d_inner x d_state float32, then conv: n_layers x d_inner x (d_conv-1)

All little-endian. The watermark sits at fixed offsets so that a Redis Lua script can
compare it (``struct.unpack('<d', blob, 33)``) without knowing the array shapes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import torch

from .config import ModelConfig

STATE_FORMAT_VERSION = 1
MAGIC = b"DYGS"
HEADER = struct.Struct("<4sHBBHHIHH8s4xdqq8x")
HEADER_SIZE = HEADER.size
WATERMARK_T_OFFSET = 32
WATERMARK_SEQ_OFFSET = 40
DTYPE_FLOAT32 = 1
FLAG_HAS_EVENTS = 1
# A node that has never applied an event has this watermark: any event is newer.
NO_TIME = float("-inf")
NO_SEQ = -1

assert HEADER_SIZE == 64, HEADER_SIZE


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
        return NodeStates(self.h[idx], self.conv[idx], self.t_last[idx], self.last_seq[idx], self.n_events[idx])

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
        return NodeStates(self.h.clone(), self.conv.clone(), self.t_last.clone(), self.last_seq.clone(), self.n_events.clone())

    @property
    def has_events(self) -> torch.Tensor:
        return self.n_events > 0


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
        self.blob_size = HEADER_SIZE + 4 * (self._h_size + self._conv_size)
        self._shape_fields = (
            MAGIC, STATE_FORMAT_VERSION, DTYPE_FLOAT32, config.n_layers, config.d_state,
            config.d_inner, config.d_conv, 0, self._version_bytes,
        )  # fmt: skip

    def _header(self, t_last: float, seq: int, n_events: int) -> bytes:
        magic, version, dtype, n_layers, d_state, d_inner, d_conv, _, mv = self._shape_fields
        flags = FLAG_HAS_EVENTS if n_events > 0 else 0
        return HEADER.pack(magic, version, dtype, flags, n_layers, d_state, d_inner, d_conv, 0, mv, t_last, seq, n_events)

    def encode_many(self, states: NodeStates) -> list[bytes]:
        """One blob per node. Arrays are written in one contiguous numpy pass."""
        n = len(states)
        h = states.h.detach().to(torch.float32).contiguous().numpy().reshape(n, -1)
        conv = states.conv.detach().to(torch.float32).contiguous().numpy().reshape(n, -1)
        body = np.concatenate([h, conv], axis=1)
        t = states.t_last.tolist()
        s = states.last_seq.tolist()
        c = states.n_events.tolist()
        return [self._header(t[i], s[i], c[i]) + body[i].tobytes() for i in range(n)]

    def check_header(self, blob: bytes) -> tuple[float, int, int]:
        """Validate a blob's header against this codec; return (t_last, last_seq, n_events)."""
        if len(blob) != self.blob_size:
            raise StateFormatError(f"state blob has {len(blob)} bytes, expected {self.blob_size}")
        fields = HEADER.unpack_from(blob)
        magic, version, dtype, _flags, n_layers, d_state, d_inner, d_conv, _res, mv, t, seq, cnt = fields
        if magic != MAGIC:
            raise StateFormatError("not a dygserve state blob (bad magic)")
        if version != STATE_FORMAT_VERSION:
            raise StateFormatError(f"state format {version}, this code reads {STATE_FORMAT_VERSION}")
        if (dtype, n_layers, d_state, d_inner, d_conv) != (DTYPE_FLOAT32, *self._shape_fields[3:7]):
            raise StateFormatError("state blob shapes do not match the model config")
        if mv != self._version_bytes:
            raise StateFormatError(f"state blob belongs to model {mv.hex()}, not {self.model_version}")
        return t, seq, cnt

    def decode_many(self, blobs: list[bytes]) -> NodeStates:
        n = len(blobs)
        if n == 0:
            return NodeStates.initial(0, self.config)
        meta = [self.check_header(b) for b in blobs]
        raw = np.frombuffer(b"".join(blobs), dtype=np.uint8).reshape(n, self.blob_size)
        body = raw[:, HEADER_SIZE:].copy().view(np.float32)
        h = torch.from_numpy(body[:, : self._h_size].reshape(n, *self._h_shape).copy())
        conv = torch.from_numpy(body[:, self._h_size :].reshape(n, *self._conv_shape).copy())
        t, s, c = zip(*meta, strict=True)
        return NodeStates(
            h=h,
            conv=conv,
            t_last=torch.tensor(t, dtype=torch.float64),
            last_seq=torch.tensor(s, dtype=torch.int64),
            n_events=torch.tensor(c, dtype=torch.int64),
        )


def read_watermark(blob: bytes) -> tuple[float, int]:
    """(t_last, last_seq) of a blob without decoding its arrays."""
    (t,) = struct.unpack_from("<d", blob, WATERMARK_T_OFFSET)
    (s,) = struct.unpack_from("<q", blob, WATERMARK_SEQ_OFFSET)
    return t, s
