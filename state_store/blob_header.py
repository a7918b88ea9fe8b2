"""The fixed 64-byte header of every state blob, and the watermark inside it.

The store compares and keeps blobs without knowing what a model puts after the
header; it only needs the watermark, at fixed offsets, for the compare-and-set and
for "what is already applied". The model's codec (``model.node_state.StateCodec``)
fills the shape fields and appends its arrays.

::

    offset size  field
    0      4     magic b"DYGS"
    4      2     state format version (u16)
    6      1     dtype code (1 = float32)
    7      1     flags (bit 0: the node has applied at least one event)
    8      2     n_layers (u16)
    10     2     d_state (u16)
    12     4     d_inner (u32)
    16     2     d_conv (u16)
    18     2     L: neighbour list length (u16)
    20     8     model version (the 16 hex digits as 8 raw bytes)
    28     4     reserved (aligns the watermark to 8 bytes)
    32     8     t_last (f64): time of the last applied event   -- watermark
    40     8     last_seq (i64): log sequence of that event      -- watermark
    48     8     n_events (i64): number of applied events
    56     8     reserved

All little-endian. A Redis Lua script compares the watermark as the 16 raw bytes at
``WATERMARK_T_OFFSET`` (``GETRANGE key 32 47``).
"""

from __future__ import annotations

import struct

MAGIC = b"DYGS"
HEADER = struct.Struct("<4sHBBHHIHH8s4xdqq8x")
HEADER_SIZE = HEADER.size
WATERMARK_T_OFFSET = 32
WATERMARK_SEQ_OFFSET = 40
WATERMARK_SIZE = 16  # t_last (f64) + last_seq (i64)
N_EVENTS_OFFSET = 48
FLAGS_OFFSET = 7  # the only header byte before the watermark that differs between blobs
FIXED_HEADER_END = 28  # magic .. model version: equal in every blob of one codec
DTYPE_FLOAT32 = 1
FLAG_HAS_EVENTS = 1
# A node that has never applied an event has this watermark: any event is newer.
NO_TIME = float("-inf")
NO_SEQ = -1

assert HEADER_SIZE == 64, HEADER_SIZE

Watermark = tuple[float, int]


def read_watermark(blob: bytes) -> Watermark:
    """(t_last, last_seq) of a blob without decoding anything else."""
    (t,) = struct.unpack_from("<d", blob, WATERMARK_T_OFFSET)
    (s,) = struct.unpack_from("<q", blob, WATERMARK_SEQ_OFFSET)
    return t, s


def pack_watermark(mark: Watermark) -> bytes:
    """The 16 watermark bytes as they sit in a blob (what a compare-and-set compares)."""
    return struct.pack("<dq", float(mark[0]), int(mark[1]))


def watermark_bytes(blob: bytes) -> bytes:
    return blob[WATERMARK_T_OFFSET : WATERMARK_T_OFFSET + WATERMARK_SIZE]


def with_watermark_seq(blob: bytes, seq: int) -> bytes:
    """``blob`` with ``seq`` as its watermark's last_seq, nothing else changed."""
    return blob[:WATERMARK_SEQ_OFFSET] + struct.pack("<q", seq) + blob[WATERMARK_SEQ_OFFSET + 8 :]
