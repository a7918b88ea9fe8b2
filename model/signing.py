"""Checkpoint authenticity (optional): an HMAC-SHA256 signature over the manifest of
the checkpoint's file hashes, in ``signature.json``.

``checksums.json`` catches a truncated or corrupted file, but anyone who can write the
folder can rewrite it too. With a verification key configured
(``DYGSERVE_CHECKPOINT_KEY`` or ``DYGSERVE_CHECKPOINT_KEY_FILE``), the service refuses,
at start and at reload, a checkpoint that is unsigned or whose signature does not
match the hashes of the bytes it is about to load; ``dygserve sign-checkpoint`` signs
one. HMAC needs the same secret to sign and to verify (no public-key scheme here:
Ed25519 would need the ``cryptography`` package, which this project does not install).

The manifest is recomputed from the bytes read, never taken from the folder: a
signature is valid only for exactly those bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SIGNATURE_FILE = "signature.json"
MANIFEST_FORMAT = "dygserve-checkpoint-manifest/1"
ALGORITHM = "hmac-sha256"
MIN_KEY_BYTES = 16  # shorter secrets are guessable


class SignatureError(ValueError):
    """An unsigned or wrongly signed checkpoint, with a verification key configured."""


def manifest(files: Mapping[str, bytes]) -> bytes:
    """Canonical JSON of the sha256 of each named file's bytes: what is signed."""
    doc = {
        "format": MANIFEST_FORMAT,
        "files": {name: hashlib.sha256(data).hexdigest() for name, data in sorted(files.items())},
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def check_key(key: bytes) -> bytes:
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"a checkpoint key needs at least {MIN_KEY_BYTES} bytes")
    return key


def signature_of(files: Mapping[str, bytes], key: bytes) -> str:
    return hmac.new(check_key(key), manifest(files), hashlib.sha256).hexdigest()


def signature_document(files: Mapping[str, bytes], key: bytes) -> dict[str, Any]:
    return {
        "algorithm": ALGORITHM,
        "manifest": json.loads(manifest(files)),
        "signature": signature_of(files, key),
    }


def write_signature(directory: Path, files: Mapping[str, bytes], key: bytes) -> Path:
    path = Path(directory) / SIGNATURE_FILE
    path.write_text(json.dumps(signature_document(files, key), indent=2, sort_keys=True) + "\n")
    return path


def verify(directory: Path, files: Mapping[str, bytes], key: bytes) -> None:
    """Raise ``SignatureError`` unless ``signature.json`` signs exactly these bytes
    with ``key``."""
    path = Path(directory) / SIGNATURE_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise SignatureError(
            f"checkpoint is not signed (no {SIGNATURE_FILE}) and a verification key is "
            "configured: sign it with `dygserve sign-checkpoint`"
        ) from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SignatureError(f"{SIGNATURE_FILE} is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("algorithm") != ALGORITHM:
        got = doc.get("algorithm") if isinstance(doc, dict) else None
        raise SignatureError(f"{SIGNATURE_FILE}: algorithm {got!r}, expected {ALGORITHM!r}")
    given = doc.get("signature")
    expected = signature_of(files, key)
    if not isinstance(given, str) or not hmac.compare_digest(given, expected):
        raise SignatureError(
            "checkpoint signature does not match: signed with another key, or its files "
            "changed since it was signed"
        )
