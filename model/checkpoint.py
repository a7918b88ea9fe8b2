"""Checkpoints: ``config.json`` + ``weights.safetensors`` (+ ``checksums.json``). Never pickle.

* The model version is the first 16 hex digits of sha256 over the canonical
  config JSON, the bytes of ``weights.safetensors`` and STATE_FORMAT_VERSION.
  Nothing else in the folder counts (metrics, plots, checksums).
* ``checksums.json`` records the sha256 of both files and the version; loading
  refuses a checkpoint whose files do not match it, or whose tensors do not have
  the names and shapes the config implies, with a message that says which.
* ``signature.json`` (optional, ``model.signing``): with a verification key, an
  unsigned or wrongly signed checkpoint is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save_file

from .config import ModelConfig
from .link_model import DygMambaLinkModel
from .node_state import STATE_FORMAT_VERSION
from .signing import SignatureError, verify, write_signature

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "weights.safetensors"
CHECKSUMS_FILE = "checksums.json"
METRICS_FILE = "metrics.json"
CHECKPOINT_FORMAT = "dygserve-checkpoint/1"
# Config fields added after some checkpoints were saved, with the value that reproduces
# what those checkpoints compute. A field's default in ``ModelConfig`` is for new models;
# a checkpoint whose config.json lacks the field loads with the value here, so one model
# version (a hash of the file as saved) always means the same numbers, and its states
# stored under that version stay valid. ``delta_min``: checkpoints trained before the
# event step had a floor (zero gaps did not decay); they still serve on every CPU path
# and on torch's CUDA path, but not through mamba-ssm's kernels (u = Delta_in x / 0).
LEGACY_CONFIG_DEFAULTS: dict[str, Any] = {"delta_min": 0.0}
# The checkpoint shipped with the code (and copied into the image): what `serve`,
# `backfill` and the benches load when no other is named.
BUNDLED_CHECKPOINT = Path(__file__).resolve().parents[1] / "checkpoints" / "default"


class CheckpointError(ValueError):
    """A checkpoint that cannot be trusted or does not fit this code."""


@dataclass(frozen=True)
class LoadedCheckpoint:
    path: Path
    config: ModelConfig
    model: DygMambaLinkModel
    version: str
    metrics: dict[str, Any]


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def model_version(config_doc: dict[str, Any], weights: bytes) -> str:
    h = hashlib.sha256()
    h.update(canonical_json(config_doc))
    h.update(weights)
    h.update(str(STATE_FORMAT_VERSION).encode())
    return h.hexdigest()[:16]


def save_checkpoint(
    directory: str | Path, model: DygMambaLinkModel, metrics: dict[str, Any] | None = None
) -> str:
    """Write the checkpoint; returns its model version."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"format": CHECKPOINT_FORMAT, "model": model.config.model_dump(mode="json")}
    config_bytes = json.dumps(doc, indent=2, sort_keys=True).encode() + b"\n"
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": CHECKPOINT_FORMAT})
    # safetensors creates the file 0600; a non-root service user must be able to read it.
    os.chmod(out / WEIGHTS_FILE, 0o644)
    weights = (out / WEIGHTS_FILE).read_bytes()
    (out / CONFIG_FILE).write_bytes(config_bytes)
    version = model_version(doc, weights)
    checksums = {
        CONFIG_FILE: _sha256(config_bytes),
        WEIGHTS_FILE: _sha256(weights),
        "model_version": version,
    }
    (out / CHECKSUMS_FILE).write_text(json.dumps(checksums, indent=2, sort_keys=True) + "\n")
    if metrics is not None:
        (out / METRICS_FILE).write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    return version


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError as exc:
        raise CheckpointError(f"checkpoint file missing: {path}") from exc


def sign_checkpoint(directory: str | Path, key: bytes) -> Path:
    """Write ``signature.json``: HMAC-SHA256 with ``key`` over the hashes of the config
    and weights (``model.signing``). Checks the checkpoint loads first."""
    path = Path(directory)
    load_checkpoint(path)  # never sign something that would be refused anyway
    files = {CONFIG_FILE: _read(path / CONFIG_FILE), WEIGHTS_FILE: _read(path / WEIGHTS_FILE)}
    return write_signature(path, files, key)


def load_checkpoint(directory: str | Path, verify_key: bytes | None = None) -> LoadedCheckpoint:
    """Load and check a checkpoint; with ``verify_key``, also its signature.

    Each file is read once: the hashes, the signature and the model all come from
    those same bytes, so a file swapped after it was checked is never what loads."""
    path = Path(directory)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {path}")
    config_bytes = _read(path / CONFIG_FILE)
    weights = _read(path / WEIGHTS_FILE)
    if verify_key is not None:
        try:
            verify(path, {CONFIG_FILE: config_bytes, WEIGHTS_FILE: weights}, verify_key)
        except SignatureError as exc:
            raise CheckpointError(str(exc)) from exc
    try:
        checksums = json.loads(_read(path / CHECKSUMS_FILE))
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{CHECKSUMS_FILE} is not valid JSON: {exc}") from exc
    for name, data in ((CONFIG_FILE, config_bytes), (WEIGHTS_FILE, weights)):
        if checksums.get(name) != _sha256(data):
            raise CheckpointError(
                f"{name} does not match its sha256 in {CHECKSUMS_FILE}: tampered or truncated"
            )
    try:
        doc = json.loads(config_bytes)
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{CONFIG_FILE} is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{CONFIG_FILE} is not a {CHECKPOINT_FORMAT} config")
    # The version is derived from the verified config and weights and the state format
    # this code writes; the one in checksums.json is what it was when saved (a state
    # format change gives old checkpoints a new version, hence fresh state keys).
    version = model_version(doc, weights)
    try:
        config = ModelConfig.model_validate({**LEGACY_CONFIG_DEFAULTS, **doc["model"]})
    except Exception as exc:  # pydantic's ValidationError, missing key
        raise CheckpointError(f"invalid model config: {exc}") from exc
    model = DygMambaLinkModel(config)
    try:
        tensors = load(weights)  # the bytes hashed above, not a second read of the file
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{WEIGHTS_FILE} is not a readable safetensors file: {exc}") from exc
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    if missing or extra:
        raise CheckpointError(
            f"weights do not fit the config: missing {missing[:5]}, unexpected {extra[:5]}"
        )
    for name, tensor in tensors.items():
        if (
            tuple(tensor.shape) != tuple(expected[name].shape)
            or tensor.dtype != expected[name].dtype
        ):
            raise CheckpointError(
                f"tensor {name!r} has shape {tuple(tensor.shape)} {tensor.dtype}, "
                f"the config implies {tuple(expected[name].shape)} {expected[name].dtype}"
            )
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise CheckpointError(f"tensor {name!r} holds non-finite values")
    model.load_state_dict(tensors)
    model.eval()
    metrics_path = path / METRICS_FILE
    metrics = json.loads(metrics_path.read_text()) if metrics_path.exists() else {}
    return LoadedCheckpoint(path=path, config=config, model=model, version=version, metrics=metrics)
