"""The node head: its inputs read a node's state as link scoring does (decay to tau,
read-out), and its checkpoint files are checked like the link model's."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from model.checkpoint import CheckpointError, save_checkpoint
from model.config import ModelConfig
from model.events import NodeEvent
from model.link_model import DygMambaLinkModel
from model.node_head import ACTIVITY_DIM, NodeClassifierHead, NodeHeadConfig, node_head_inputs
from model.node_head_checkpoint import (
    HEAD_CONFIG_FILE,
    HEAD_WEIGHTS_FILE,
    has_node_head,
    load_node_head,
    save_node_head,
)
from model.node_state import NodeStates
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
