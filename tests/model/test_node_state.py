from __future__ import annotations

import struct

import pytest
import torch

from model.config import ModelConfig
from model.node_ids import MAX_ID_BYTES
from model.node_state import PAD_KEY, NeighbourLists, NodeStates, StateCodec, StateFormatError
from model.role_counts import RECORD_WIDTH, TIMES
from state_store.blob_header import HEADER_SIZE, read_watermark

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
    assert (
        codec.blob_size == HEADER_SIZE + 4 * (2 * 16 * 4 + 2 * 16 * 2) + 16 * CFG.neighbour_list_len
    )
    # no lists given: empty lists
    empty = codec.decode_with_neighbours(blobs)[1]
    assert (empty.keys == PAD_KEY).all() and torch.isinf(empty.times).all()


def test_neighbour_lists_round_trip_exactly():
    cfg = CFG.with_updates(neighbour_list_len=4)
    codec = StateCodec(cfg, "00ff00ff00ff00ff")
    lists = NeighbourLists.from_lists(
        [[5, 2**62 + 3], [], [1, 2, 3, 4, 5]], [[0.5, 1e15 + 0.25], [], [1, 2, 3, 4, 5.5]], 4
    )
    blobs = codec.encode_many(some_states(3), lists)
    back = codec.decode_with_neighbours(blobs)[1]
    assert back.keys.tolist() == [[PAD_KEY, PAD_KEY, 5, 2**62 + 3], [PAD_KEY] * 4, [2, 3, 4, 5]]
    assert back.times[0, 2:].tolist() == [0.5, 1e15 + 0.25] and back.times[2].tolist() == [
        2,
        3,
        4,
        5.5,
    ]
    assert torch.isinf(back.times[1]).all()
    # the list length is in the header (bytes 18..19), checked like the other shapes
    damaged = blobs[0][:18] + struct.pack("<H", 5) + blobs[0][20:]
    with pytest.raises(StateFormatError, match="shapes"):
        codec.decode_with_neighbours([damaged])


class _E:
    def __init__(self, key: int, t: float) -> None:
        self.other_key, self.t = key, t


def test_extended_keeps_the_last_l_entries_in_order():
    lists = NeighbourLists.from_lists([[1, 2], [], [7, 8, 9]], [[1.0, 2.0], [], [7.0, 8.0, 9.0]], 3)
    new = [[_E(3, 3.0)], [_E(4, 4.0), _E(5, 5.0), _E(6, 6.0), _E(7, 7.0)], []]
    out = lists.extended(new)
    assert out.keys.tolist() == [[1, 2, 3], [5, 6, 7], [7, 8, 9]]
    assert out.times.tolist() == [[1.0, 2.0, 3.0], [5.0, 6.0, 7.0], [7.0, 8.0, 9.0]]
    # the same as building the lists from whole sequences
    ref = NeighbourLists.from_lists(
        [[1, 2, 3], [4, 5, 6, 7], [7, 8, 9]],
        [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [7.0, 8.0, 9.0]],
        3,
    )
    assert torch.equal(out.keys, ref.keys) and torch.equal(out.times, ref.times)


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
    # one damaged blob among good ones (headers are checked for all rows at once)
    good = codec.encode_many(some_states(5))
    with pytest.raises(StateFormatError, match=message):
        codec.decode_many(good[:3] + [mutate(good[3])] + good[4:])


def test_other_model_version_is_refused():
    blob = StateCodec(CFG, "00ff00ff00ff00ff").encode_many(some_states(1))[0]
    with pytest.raises(StateFormatError, match="belongs to model"):
        StateCodec(CFG, "1111111111111111").decode_many([blob])


def test_decoded_states_own_their_memory():
    """Decoded tensors are copies: updating them in place (as the applier and the cold
    path do) must not write into the blob bytes, even for a single blob whose rows are
    already contiguous."""
    codec = StateCodec(CFG, "00ff00ff00ff00ff")
    blob = codec.encode_many(some_states(1))[0]
    before = bytearray(blob)  # a real copy (bytes(blob) is blob itself)
    states, lists = codec.decode_with_neighbours([blob])
    for x in (
        states.h,
        states.conv,
        states.t_last,
        states.last_seq,
        states.n_events,
        lists.keys,
        lists.times,
    ):
        x.add_(1)
    assert blob == before


def test_role_count_records_round_trip_and_size_the_blob():
    """With ``role_counts`` the record travels after the list, exactly; a blob of the
    model without them is refused by size."""
    cfg = CFG.with_updates(neighbour_list_len=4, role_counts=True)
    codec = StateCodec(cfg, "00ff00ff00ff00ff")
    assert (
        codec.blob_size
        == StateCodec(CFG.with_updates(neighbour_list_len=4), "00ff00ff00ff00ff").blob_size
        + 8 * RECORD_WIDTH
    )
    lists = NeighbourLists.empty(3, 4, role_counts=True)
    lists.records[1] = torch.arange(RECORD_WIDTH, dtype=torch.float64) + 0.25
    blobs = codec.encode_many(some_states(3), lists)
    back = codec.decode_with_neighbours(blobs)[1]
    assert back.records is not None and torch.equal(back.records, lists.records)
    assert torch.isinf(back.records[0, TIMES]).all()  # an empty record stays empty
    plain = StateCodec(cfg.with_updates(role_counts=False), "00ff00ff00ff00ff")
    with pytest.raises(StateFormatError, match="bytes"):
        plain.decode_with_neighbours(blobs)
    with pytest.raises(ValueError, match="role_counts"):
        codec.encode_many(some_states(3), NeighbourLists.empty(3, 4))


def test_newest_neighbour_ids_round_trip_after_the_transition_counts():
    """With ``latest_transition_at_query`` a blob names its newest neighbour (what a
    query reads the record of) after the transition counts, which decode unchanged;
    a codec without it has no such field."""
    base = CFG.with_updates(
        neighbour_list_len=4, transition_buckets=8, latest_transition_count=True
    )
    cfg = base.with_updates(latest_transition_at_query=True)
    codec = StateCodec(cfg, "00ff00ff00ff00ff")
    assert codec.blob_size == StateCodec(base, "00ff00ff00ff00ff").blob_size + 2 + MAX_ID_BYTES
    lists = NeighbourLists.empty_for(3, cfg)
    lists.transitions.counts[:] = torch.arange(lists.transitions.counts.size).reshape(3, -1).numpy()
    longest = "é" * (MAX_ID_BYTES // 2)  # 256 bytes of UTF-8
    blobs = codec.encode_many(some_states(3), lists, ["user-7", "", longest])
    assert codec.newest_ids(blobs) == ["user-7", "", longest]
    assert codec.newest_ids([None, blobs[0]]) == ["", "user-7"]
    back = codec.decode_with_neighbours(blobs)[1]
    assert (back.transitions.counts == lists.transitions.counts).all()
    assert codec.newest_ids(codec.encode_many(some_states(3), lists)) == ["", "", ""]
    with pytest.raises(ValueError, match="257 bytes"):
        codec.encode_many(some_states(1), NeighbourLists.empty_for(1, cfg), [longest + "x"])
    plain = StateCodec(base, "00ff00ff00ff00ff")
    with pytest.raises(ValueError, match="no newest-neighbour ids"):
        plain.encode_many(some_states(1), NeighbourLists.empty_for(1, base), ["a"])
    with pytest.raises(ValueError, match="no newest-neighbour ids"):
        plain.newest_ids([None])
