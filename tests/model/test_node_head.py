"""The node head: its inputs read a node's state as link scoring does (decay to tau,
read-out), and its checkpoint files are checked like the link model's."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from model.checkpoint import CheckpointError, save_checkpoint
from model.config import ModelConfig, TimeNormalisation
from model.events import NodeEvent
from model.link_model import DygMambaLinkModel
from model.node_head import (
    ACTIVITY_DIM,
    RECENT_PACE_DIM,
    NodeClassifierHead,
    NodeHeadConfig,
    node_head_inputs,
    recent_neighbour_buckets,
    recent_pace,
)
from model.node_head_checkpoint import (
    HEAD_CONFIG_FILE,
    HEAD_WEIGHTS_FILE,
    has_node_head,
    load_node_head,
    save_node_head,
)
from model.node_state import NeighbourLists, NodeStates
from model.streaming import advance


@pytest.fixture()
def model() -> DygMambaLinkModel:
    torch.manual_seed(0)
    return DygMambaLinkModel(ModelConfig(edge_feature_dim=2, d_model=8, d_state=4)).eval()


def states_after(model, per_node) -> NodeStates:
    return advance(model, NodeStates.initial(len(per_node), model.config), per_node)


def events(times, key=7):
    return [NodeEvent(key, 0, (0.5, -1.0), t, i) for i, t in enumerate(times)]


def test_inputs_are_the_decayed_readout_and_activity(model):
    cfg = NodeHeadConfig(link_model_version="x", d_readout=model.config.d_out)
    st = states_after(model, [events([1.0, 2.0, 5.0]), events([3.0])])
    tau = torch.tensor([9.0, 3.0], dtype=torch.float64)
    x = node_head_inputs(model, cfg, st, tau)
    assert x.shape == (2, model.config.d_out + ACTIVITY_DIM)
    with torch.no_grad():
        expected = model.node_readout(st.h, st.t_last, tau)
    torch.testing.assert_close(x[:, : model.config.d_out], expected)
    scale = model.config.time_norm.scale
    age = torch.log1p(torch.tensor([4.0 / scale, 0.0]))
    torch.testing.assert_close(x[:, -3], age)
    torch.testing.assert_close(x[:, -2], torch.log1p(torch.tensor([3.0, 1.0])))
    torch.testing.assert_close(x[:, -1], torch.ones(2))


def test_a_query_before_the_last_event_reads_the_state_at_it(model):
    cfg = NodeHeadConfig(link_model_version="x", d_readout=model.config.d_out)
    st = states_after(model, [events([1.0, 5.0])])
    early = node_head_inputs(model, cfg, st, torch.tensor([2.0], dtype=torch.float64))
    at = node_head_inputs(model, cfg, st, torch.tensor([5.0], dtype=torch.float64))
    later = node_head_inputs(model, cfg, st, torch.tensor([500.0], dtype=torch.float64))
    torch.testing.assert_close(early, at)
    assert not torch.allclose(at, later)


def test_event_features_are_required_when_the_head_reads_them(model):
    cfg = NodeHeadConfig(link_model_version="x", d_readout=model.config.d_out, event_feature_dim=2)
    st = states_after(model, [events([1.0])])
    tau = torch.tensor([2.0], dtype=torch.float64)
    with pytest.raises(ValueError, match="features"):
        node_head_inputs(model, cfg, st, tau)
    x = node_head_inputs(model, cfg, st, tau, torch.tensor([[3.0, 4.0]]))
    assert x[0, -2:].tolist() == [3.0, 4.0]


def test_recent_pace_is_the_mean_standardised_log_gap_of_the_list():
    norm = TimeNormalisation(scale=2.0, log_mean=0.5, log_std=1.5)
    inf = float("inf")
    times = torch.tensor(
        [
            [inf, inf, inf, 1.0, 2.0, 5.0],  # gaps 1 and 3
            [inf, inf, inf, inf, inf, 1.0],  # one event: no gap
            [inf] * 6,  # nothing
        ],
        dtype=torch.float64,
    )
    x = recent_pace(times, norm)
    z = [(torch.log1p(torch.tensor(g / 2.0)) - 0.5) / 1.5 for g in (1.0, 3.0)]
    torch.testing.assert_close(x[0], torch.tensor([float((z[0] + z[1]) / 2), 1.0]))
    assert x[1].tolist() == [0.0, 0.0] and x[2].tolist() == [0.0, 0.0]


def test_a_head_that_reads_the_recent_pace_needs_the_neighbour_lists(model):
    cfg = NodeHeadConfig(link_model_version="x", d_readout=model.config.d_out, use_recent_pace=True)
    assert cfg.input_dim == model.config.d_out + ACTIVITY_DIM + RECENT_PACE_DIM
    st = states_after(model, [events([1.0, 2.0, 5.0])])
    tau = torch.tensor([9.0], dtype=torch.float64)
    with pytest.raises(ValueError, match="neighbour lists"):
        node_head_inputs(model, cfg, st, tau)
    lists = NeighbourLists.from_lists([[7, 7, 7]], [[1.0, 2.0, 5.0]], 4)
    x = node_head_inputs(model, cfg, st, tau, neighbours=lists)
    torch.testing.assert_close(
        x[:, -RECENT_PACE_DIM:], recent_pace(lists.times, model.config.time_norm)
    )
    assert x[0, -1] == 1.0
    # A query before the last event reads the list as it is, like the clamped state.
    early = node_head_inputs(model, cfg, st, torch.tensor([2.0], dtype=torch.float64), None, lists)
    at = node_head_inputs(model, cfg, st, torch.tensor([5.0], dtype=torch.float64), None, lists)
    torch.testing.assert_close(early, at)


def make_head_checkpoint(tmp_path, model):
    link_version = save_checkpoint(tmp_path, model)
    torch.manual_seed(1)
    head = NodeClassifierHead(
        NodeHeadConfig(link_model_version=link_version, d_readout=model.config.d_out)
    )
    head.fit_standardisation(torch.randn(50, head.config.input_dim) * 3 + 1)
    return link_version, head, save_node_head(tmp_path, head)


def test_head_round_trip_and_version(tmp_path, model):
    link_version, head, version = make_head_checkpoint(tmp_path / "a", model)
    loaded = load_node_head(tmp_path / "a", link_version)
    assert loaded is not None and loaded.version == version
    x = torch.randn(5, head.config.input_dim)
    torch.testing.assert_close(loaded.head(x), head.eval()(x))
    # Same head saved again: same version (nothing but config, weights and link count).
    assert save_node_head(tmp_path / "b", head) == version
    assert load_node_head(tmp_path / "no-such-folder", link_version) is None
    assert not has_node_head(tmp_path / "no-such-folder")


def test_head_files_are_checked(tmp_path, model):
    link_version, _, _ = make_head_checkpoint(tmp_path / "a", model)
    with pytest.raises(CheckpointError, match="reads states of link model"):
        load_node_head(tmp_path / "a", "0123456789abcdef")

    tampered = tmp_path / "tampered"
    shutil.copytree(tmp_path / "a", tampered)
    data = bytearray((tampered / HEAD_WEIGHTS_FILE).read_bytes())
    data[-1] ^= 0xFF
    (tampered / HEAD_WEIGHTS_FILE).write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256"):
        load_node_head(tampered, link_version)

    reshaped = tmp_path / "reshaped"
    shutil.copytree(tmp_path / "a", reshaped)
    doc = json.loads((reshaped / HEAD_CONFIG_FILE).read_text())
    doc["head"]["hidden"] = 3
    (reshaped / HEAD_CONFIG_FILE).write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="do not fit"):
        load_node_head(reshaped, link_version)


def test_an_ensemble_head_is_the_mean_of_its_members_and_round_trips(tmp_path, model):
    link_version = save_checkpoint(tmp_path, model)
    torch.manual_seed(2)
    cfg = NodeHeadConfig(link_model_version=link_version, d_readout=model.config.d_out, members=3)
    head = NodeClassifierHead(cfg).eval()
    x = torch.randn(6, cfg.input_dim)
    members = head.member_logits(x)
    assert members.shape == (6, 3) and not torch.allclose(members[:, 0], members[:, 1])
    torch.testing.assert_close(head(x), members.mean(dim=-1))
    version = save_node_head(tmp_path, head)
    loaded = load_node_head(tmp_path, link_version)
    assert loaded is not None and loaded.version == version and loaded.config.members == 3
    torch.testing.assert_close(loaded.head(x), head(x))


def test_recent_neighbour_buckets_are_the_newest_keys_hashed_newest_first():
    keys = torch.tensor([[-1, 5, 1030, 7], [-1, -1, -1, 3], [-1, -1, -1, -1]])
    b = recent_neighbour_buckets(keys, 3, 1024)
    # 1030 falls in bucket 6; an empty rank is the extra row 1024.
    assert b.tolist() == [[7.0, 6.0, 5.0], [3.0, 1024.0, 1024.0], [1024.0] * 3]
    # A list shorter than the depth pads the older ranks.
    assert recent_neighbour_buckets(keys[:, -2:], 3, 1024)[0].tolist() == [7.0, 6.0, 1024.0]


def test_a_head_that_embeds_recent_neighbours_reads_them_and_round_trips(tmp_path, model):
    link_version = save_checkpoint(tmp_path, model)
    cfg = NodeHeadConfig(
        link_model_version=link_version,
        d_readout=model.config.d_out,
        use_recent_pace=True,
        recent_neighbours=2,
        neighbour_buckets=16,
        members=2,
    )
    assert cfg.reads_neighbour_lists and cfg.input_dim == cfg.numeric_dim + 2
    st = states_after(model, [events([1.0, 2.0]), events([1.0, 2.0])])
    tau = torch.tensor([3.0, 3.0], dtype=torch.float64)
    lists = NeighbourLists.from_lists([[4, 9], [4, 21]], [[1.0, 2.0], [1.0, 2.0]], 4)
    with pytest.raises(ValueError, match="neighbour lists"):
        node_head_inputs(model, cfg, st, tau)
    x = node_head_inputs(model, cfg, st, tau, neighbours=lists)
    assert x[:, -2:].tolist() == [[9.0, 4.0], [5.0, 4.0]]
    torch.manual_seed(3)
    head = NodeClassifierHead(cfg).eval()
    head.fit_standardisation(
        torch.cat([torch.randn(20, cfg.numeric_dim), x[:1].expand(20, -1)[:, -2:]], 1)
    )
    # Only the numeric columns are standardised; the buckets pick embedding rows, so
    # the two nodes (same state, another newest neighbour) get different logits.
    assert head.input_mean.shape == (cfg.numeric_dim,)
    logits = head(x)
    assert logits[0] != logits[1]
    with torch.no_grad():
        head.neighbour_tables[0].weight[5] = head.neighbour_tables[0].weight[9]
    torch.testing.assert_close(head(x)[0], head(x)[1])
    version = save_node_head(tmp_path, head)
    loaded = load_node_head(tmp_path, link_version)
    assert loaded is not None and loaded.version == version
    torch.testing.assert_close(loaded.head(x), head(x))
