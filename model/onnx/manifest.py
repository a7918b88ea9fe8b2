"""The ONNX export's manifest: file names, graph signatures, and the checked reader.

Shared by the exporter (``model.onnx.export``, which writes it) and the runtime
(``model.onnx.runtime``, which refuses an export that does not match it), so that
neither imports the other for its constants.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ..checkpoint import CheckpointError

MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "dygserve-onnx/1"
STEP_FILE = "step.onnx"
READOUT_HEAD_FILE = "readout_head.onnx"
STEP_INPUTS = ("h", "conv", "t_last", "other_key", "role", "features", "t")
STEP_OUTPUTS = ("h_new", "conv_new")
READOUT_HEAD_INPUTS = ("h_u", "t_last_u", "h_v", "t_last_v", "tau", "pair", "pair_ids")
READOUT_HEAD_OUTPUTS = ("logits",)
BATCH_DIM = "batch"


class OnnxManifestError(CheckpointError):
    """An ONNX export that does not belong to this checkpoint or was altered."""


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_manifest(onnx_dir: str | Path, expected_version: str | None = None) -> dict[str, Any]:
    """The manifest of an export folder, checked: format, model version, file hashes."""
    d = Path(onnx_dir)
    try:
        manifest = json.loads((d / MANIFEST_FILE).read_text())
    except FileNotFoundError as exc:
        raise OnnxManifestError(f"no {MANIFEST_FILE} in {d}: not an ONNX export") from exc
    except json.JSONDecodeError as exc:
        raise OnnxManifestError(f"{d / MANIFEST_FILE} is not valid JSON: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise OnnxManifestError(f"{d / MANIFEST_FILE} is not a {MANIFEST_FORMAT} manifest")
    if expected_version is not None and manifest.get("model_version") != expected_version:
        raise OnnxManifestError(
            f"ONNX export in {d} is of model {manifest.get('model_version')}, "
            f"the checkpoint is {expected_version}: re-export it"
        )
    for name in ("step", "readout_head"):
        g = manifest.get("graphs", {}).get(name)
        if not g:
            raise OnnxManifestError(f"{d / MANIFEST_FILE} lists no {name} graph")
        path = d / g["file"]
        if not path.is_file():
            raise OnnxManifestError(f"ONNX graph missing: {path}")
        if sha256_file(path) != g.get("sha256"):
            raise OnnxManifestError(
                f"{path} does not match its sha256 in {MANIFEST_FILE}: tampered or truncated"
            )
    return manifest
