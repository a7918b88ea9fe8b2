"""Checkpoint authenticity (model.signing) and the single read of each file.

With a verification key an unsigned, wrongly signed or since-modified checkpoint is
refused; ``dygserve sign-checkpoint`` signs one. The hashes, the signature and the
loaded model come from the same bytes: a weights file swapped on disk right after it
was read (and hashed) is not what loads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import model.checkpoint as checkpoint_module
from model.checkpoint import (
    CHECKSUMS_FILE,
    CONFIG_FILE,
    WEIGHTS_FILE,
    CheckpointError,
    _sha256,
    load_checkpoint,
    model_version,
    save_checkpoint,
    sign_checkpoint,
)
from model.config import ModelConfig
from model.link_model import DygMambaLinkModel
from model.signing import SIGNATURE_FILE
from service.cli import main as cli_main

KEY = b"0123456789abcdef-test-key"


def make(path: Path, seed: int) -> str:
    torch.manual_seed(seed)
    return save_checkpoint(path, DygMambaLinkModel(ModelConfig(d_model=8, d_state=4)))


def reseal_checksums(path: Path) -> None:
    """What an attacker who can write the folder does: checksums.json to match."""
    config_bytes, weights = (path / CONFIG_FILE).read_bytes(), (path / WEIGHTS_FILE).read_bytes()
    sums = {
        CONFIG_FILE: _sha256(config_bytes),
        WEIGHTS_FILE: _sha256(weights),
        "model_version": model_version(json.loads(config_bytes), weights),
    }
    (path / CHECKSUMS_FILE).write_text(json.dumps(sums))


def test_signed_loads_unsigned_and_wrong_key_refused(tmp_path: Path) -> None:
    make(tmp_path / "a", seed=0)
    assert load_checkpoint(tmp_path / "a").version  # no key configured: signing is optional
    with pytest.raises(CheckpointError, match="not signed"):
        load_checkpoint(tmp_path / "a", KEY)
    sign_checkpoint(tmp_path / "a", KEY)
    assert load_checkpoint(tmp_path / "a", KEY).version
    with pytest.raises(CheckpointError, match="signature does not match"):
        load_checkpoint(tmp_path / "a", b"another-key-of-16-bytes")


def test_files_changed_after_signing_are_refused(tmp_path: Path) -> None:
    make(tmp_path / "a", seed=0)
    make(tmp_path / "b", seed=1)
    sign_checkpoint(tmp_path / "a", KEY)
    shutil.copy(tmp_path / "b" / WEIGHTS_FILE, tmp_path / "a" / WEIGHTS_FILE)
    reseal_checksums(tmp_path / "a")
    assert load_checkpoint(tmp_path / "a").version  # checksums alone cannot tell
    with pytest.raises(CheckpointError, match="signature does not match"):
        load_checkpoint(tmp_path / "a", KEY)
    # nor does a valid signature of another checkpoint (same config, other weights)
    make(tmp_path / "c", seed=2)
    sign_checkpoint(tmp_path / "b", KEY)
    shutil.copy(tmp_path / "b" / SIGNATURE_FILE, tmp_path / "c" / SIGNATURE_FILE)
    with pytest.raises(CheckpointError, match="signature does not match"):
        load_checkpoint(tmp_path / "c", KEY)
    (tmp_path / "a" / SIGNATURE_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_checkpoint(tmp_path / "a", KEY)


def test_a_file_swapped_after_it_was_read_is_not_what_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    version = make(tmp_path / "a", seed=0)
    make(tmp_path / "b", seed=1)
    want = load_checkpoint(tmp_path / "a").model.state_dict()
    real_read = checkpoint_module._read
    reads: list[str] = []

    def read_then_swap(path: Path) -> bytes:
        data = real_read(path)
        reads.append(path.name)
        if path.name == WEIGHTS_FILE:  # the attacker wins the race right after the read
            shutil.copy(tmp_path / "b" / WEIGHTS_FILE, path)
        return data

    monkeypatch.setattr(checkpoint_module, "_read", read_then_swap)
    loaded = load_checkpoint(tmp_path / "a")
    assert reads.count(WEIGHTS_FILE) == 1
    assert loaded.version == version
    for name, tensor in loaded.model.state_dict().items():
        assert torch.equal(tensor, want[name]), f"{name} came from the swapped file"


def test_sign_checkpoint_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make(tmp_path / "a", seed=0)
    key_file = tmp_path / "key"
    key_file.write_bytes(KEY + b"\n")
    assert cli_main(["sign-checkpoint", str(tmp_path / "a"), "--key-file", str(key_file)]) == 0
    assert "signed:" in capsys.readouterr().out
    assert load_checkpoint(tmp_path / "a", KEY).version
    key_file.write_bytes(b"short")
    assert cli_main(["sign-checkpoint", str(tmp_path / "a"), "--key-file", str(key_file)]) == 2
    assert "at least 16 bytes" in capsys.readouterr().err
