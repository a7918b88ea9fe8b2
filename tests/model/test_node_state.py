from __future__ import annotations

import struct

import pytest
import torch

from model.config import ModelConfig
from model.node_state import (
    HEADER_SIZE,
    NodeStates,
    StateCodec,
    StateFormatError,
    read_watermark,
)

CFG = ModelConfig(n_layers=2, d_model=8, d_state=4, d_conv=3)


def some_states(n: int = 5) -> NodeStates:
    s = NodeStates.initial(n, CFG)
    s.h.normal_()
    s.conv.normal_()
    s.t_last = torch.tensor([1.5, 1e15 + 0.25, float("-inf"), 0.0, 3.0], dtype=torch.float64)[:n]
    s.last_seq = torch.tensor([7, 2**40, -1, 0, 9])[:n]
    s.n_events = torch.tensor([3, 1, 0, 1, 2])[:n]
    return s


def test_round_trip_is_exact():
    codec = StateCodec(CFG, "00ff00ff00ff00ff")
    s = some_states()
    blobs = codec.encode_many(s)
    assert all(len(b) == codec.blob_size for b in blobs)
    back = codec.decode_many(blobs)
    for f in ("h", "conv", "t_last", "last_seq", "n_events"):
        assert torch.equal(getattr(back, f), getattr(s, f)), f
    assert read_watermark(blobs[1]) == (1e15 + 0.25, 2**40)
    # The watermark sits where a Lua script reads it (1-based offsets 33 and 41).
    assert struct.unpack_from("<d", blobs[0], 32)[0] == 1.5
    assert codec.blob_size == HEADER_SIZE + 4 * (2 * 16 * 4 + 2 * 16 * 2)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda b: b"XXXX" + b[4:], "magic"),
        (lambda b: b[:4] + struct.pack("<H", 99) + b[6:], "format"),
        (lambda b: b[:-1], "bytes"),
        (lambda b: b[:20] + bytes(8) + b[28:], "belongs to model"),
        (lambda b: b[:10] + struct.pack("<H", 5) + b[12:], "shapes"),
    ],
)
def test_foreign_or_damaged_blobs_are_refused(mutate, message):
    codec = StateCodec(CFG, "00ff00ff00ff00ff")
    blob = codec.encode_many(some_states(1))[0]
    with pytest.raises(StateFormatError, match=message):
        codec.decode_many([mutate(blob)])


def test_other_model_version_is_refused():
    blob = StateCodec(CFG, "00ff00ff00ff00ff").encode_many(some_states(1))[0]
    with pytest.raises(StateFormatError, match="belongs to model"):
        StateCodec(CFG, "1111111111111111").decode_many([blob])
