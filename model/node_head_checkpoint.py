"""A node-classification head saved beside a link checkpoint: safetensors + JSON, never pickle.

A node-classification checkpoint is a full link checkpoint (``config.json``,
``weights.safetensors``, ``checksums.json``: the link model's files, unchanged, so
its model version and hence its cached states in the store are the link model's)
plus two files:

* ``node_head.safetensors``: the head's tensors;
* ``node_head.json``: the head's config, the sha256 of its weights, and the head
  version: the first 16 hex digits of sha256 over the canonical head config, the
  weights' bytes and the link model version it reads (so a head never serves states
  of another link model: loading checks that version against the checkpoint's).

The trainer also writes ``node_metrics.json`` (validation/test AUC and AP, how it was
trained): informational, shown by ``GET /v1/model``, not part of the head version.

``load_node_head`` returns None for a folder without a head (a plain link checkpoint).
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
from safetensors.torch import load_file, save_file

from .checkpoint import CheckpointError, canonical_json
from .node_head import NodeClassifierHead, NodeHeadConfig

HEAD_CONFIG_FILE = "node_head.json"
HEAD_WEIGHTS_FILE = "node_head.safetensors"
NODE_METRICS_FILE = "node_metrics.json"
HEAD_FORMAT = "dygserve-node-head/1"


@dataclass(frozen=True)
class LoadedNodeHead:
    config: NodeHeadConfig
    head: NodeClassifierHead
    version: str
    metrics: dict[str, Any]  # node_metrics.json ({} when absent or unreadable)


def read_node_metrics(directory: str | Path) -> dict[str, Any]:
    """The trainer's node_metrics.json; {} when there is none (it only informs)."""
    try:
        doc = json.loads((Path(directory) / NODE_METRICS_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return doc if isinstance(doc, dict) else {}


def head_version(config_doc: dict[str, Any], weights: bytes, link_version: str) -> str:
    h = hashlib.sha256()
    h.update(canonical_json(config_doc))
    h.update(weights)
    h.update(link_version.encode())
    return h.hexdigest()[:16]


def has_node_head(directory: str | Path) -> bool:
    return (Path(directory) / HEAD_CONFIG_FILE).exists()


def save_node_head(directory: str | Path, head: NodeClassifierHead) -> str:
    """Write the head's two files into ``directory``; returns the head version."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()}
    save_file(tensors, str(out / HEAD_WEIGHTS_FILE), metadata={"format": HEAD_FORMAT})
    os.chmod(out / HEAD_WEIGHTS_FILE, 0o644)  # safetensors writes 0600; the service user reads it
    weights = (out / HEAD_WEIGHTS_FILE).read_bytes()
    config_doc = head.config.model_dump(mode="json")
    version = head_version(config_doc, weights, head.config.link_model_version)
    doc = {
        "format": HEAD_FORMAT,
        "head": config_doc,
        "weights_sha256": hashlib.sha256(weights).hexdigest(),
        "head_version": version,
    }
    (out / HEAD_CONFIG_FILE).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return version


def load_node_head(directory: str | Path, link_version: str) -> LoadedNodeHead | None:
    """The head in ``directory`` checked against its weights and the link model version
    the folder serves; None when the folder has no head."""
    path = Path(directory)
    if not has_node_head(path):
        return None
    try:
        doc = json.loads((path / HEAD_CONFIG_FILE).read_text())
        weights = (path / HEAD_WEIGHTS_FILE).read_bytes()
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"node head unreadable: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != HEAD_FORMAT:
        raise CheckpointError(f"{HEAD_CONFIG_FILE} is not a {HEAD_FORMAT} file")
    if doc.get("weights_sha256") != hashlib.sha256(weights).hexdigest():
        raise CheckpointError(
            f"{HEAD_WEIGHTS_FILE} does not match its sha256 in {HEAD_CONFIG_FILE}: tampered or truncated"
        )
    try:
        config = NodeHeadConfig.model_validate(doc["head"])
    except Exception as exc:  # pydantic's ValidationError, missing key
        raise CheckpointError(f"invalid node head config: {exc}") from exc
    if config.link_model_version != link_version:
        raise CheckpointError(
            f"the node head reads states of link model {config.link_model_version},"
            f" this checkpoint's link model is {link_version}"
        )
    head = NodeClassifierHead(config)
    try:
        tensors = load_file(str(path / HEAD_WEIGHTS_FILE))
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(
            f"{HEAD_WEIGHTS_FILE} is not a readable safetensors file: {exc}"
        ) from exc
    expected = head.state_dict()
    if set(tensors) != set(expected) or any(
        tuple(tensors[k].shape) != tuple(expected[k].shape) for k in expected
    ):
        raise CheckpointError("node head weights do not fit its config")
    if any(not torch.isfinite(t).all() for t in tensors.values()):
        raise CheckpointError("node head weights hold non-finite values")
    head.load_state_dict(tensors)
    head.eval()
    version = head_version(doc["head"], weights, link_version)
    return LoadedNodeHead(config, head, version, read_node_metrics(path))
