from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from model.checkpoint import CheckpointError, load_checkpoint, model_version, save_checkpoint
from model.config import ModelConfig
from model.link_model import DygMambaLinkModel

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def ckpt(tmp_path):
    torch.manual_seed(0)
    model = DygMambaLinkModel(ModelConfig(d_model=8, d_state=4))
    version = save_checkpoint(tmp_path / "ck", model, {"val_ap": 0.5})
    return tmp_path / "ck", model, version


def test_round_trip_and_version(ckpt):
    path, model, version = ckpt
    loaded = load_checkpoint(path)
    assert loaded.version == version and len(version) == 16
    assert loaded.metrics == {"val_ap": 0.5}
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[k], v)
    doc = json.loads((path / "config.json").read_text())
    assert model_version(doc, (path / "weights.safetensors").read_bytes()) == version


def test_version_ignores_other_files_and_whitespace(ckpt, tmp_path):
    path, _, version = ckpt
    (path / "metrics.json").write_text('{"val_ap": 0.9}')
    (path / "notes.txt").write_text("hello")
    assert load_checkpoint(path).version == version


def test_tampered_weights_are_refused(ckpt):
    path, _, _ = ckpt
    data = bytearray((path / "weights.safetensors").read_bytes())
    data[-3] ^= 0xFF
    (path / "weights.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256"):
        load_checkpoint(path)


def test_truncated_weights_are_refused(ckpt):
    path, _, _ = ckpt
    data = (path / "weights.safetensors").read_bytes()
    (path / "weights.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError):
        load_checkpoint(path)


def test_edited_config_is_refused(ckpt):
    path, _, _ = ckpt
    doc = json.loads((path / "config.json").read_text())
    doc["model"]["d_state"] = 8
    (path / "config.json").write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="sha256"):
        load_checkpoint(path)


def test_shape_mismatch_is_refused_even_with_matching_checksums(ckpt, tmp_path):
    """A consistent but mismatched checkpoint (weights of another config) is refused by shape."""
    path, _, _ = ckpt
    other = tmp_path / "other"
    shutil.copytree(path, other)
    tensors = load_file(str(other / "weights.safetensors"))
    name = next(k for k in tensors if k.endswith("A_log"))
    tensors[name] = torch.zeros(3, 3)
    save_file(
        tensors, str(other / "weights.safetensors"), metadata={"format": "dygserve-checkpoint/1"}
    )
    import hashlib

    sums = json.loads((other / "checksums.json").read_text())
    weights = (other / "weights.safetensors").read_bytes()
    sums["weights.safetensors"] = hashlib.sha256(weights).hexdigest()
    sums["model_version"] = model_version(json.loads((other / "config.json").read_text()), weights)
    (other / "checksums.json").write_text(json.dumps(sums))
    with pytest.raises(CheckpointError, match="shape"):
        load_checkpoint(other)


def test_missing_directory_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "nope")


def test_weights_are_world_readable(ckpt):
    path, _, _ = ckpt
    assert (path / "weights.safetensors").stat().st_mode & 0o044 == 0o044


def test_new_checkpoints_keep_their_step_floor(ckpt):
    path, model, _ = ckpt
    assert model.config.delta_min > 0
    assert load_checkpoint(path).config.delta_min == model.config.delta_min


def test_a_checkpoint_saved_before_the_step_floor_loads_without_it():
    """The bundled checkpoint until 2026-11-24 (kept in tests/fixtures) has no delta_min in
    its config.json: it keeps the recurrence it was trained with (no floor) under the same
    model version, rather than silently new numbers under an old version (whose states
    may already be in a store)."""
    bundled = REPO / "tests" / "fixtures" / "checkpoint-before-step-floor"
    doc = json.loads((bundled / "config.json").read_text())
    assert "delta_min" not in doc["model"]
    loaded = load_checkpoint(bundled)
    assert loaded.config.delta_min == 0.0
    assert all(layer.delta_min == 0.0 for layer in loaded.model.ssm_layers())
    assert loaded.version == json.loads((bundled / "checksums.json").read_text())["model_version"]
