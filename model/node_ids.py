"""Node ids: strings on the wire, stable 63-bit integer keys inside the model.

JSON integers mean the same id as their decimal string (DESIGN "HTTP contract").
The key is a keyed-free blake2b hash, so it is the same in every process and across
restarts (Python's ``hash`` is salted per process), and it never needs a vocabulary:
unseen (inductive) nodes get a key too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from functools import lru_cache

import numpy as np

MAX_ID_BYTES = 256


def canonical_id(node: str | int) -> str:
    if isinstance(node, bool):
        raise TypeError("a node id is a string or an integer, not a boolean")
    if isinstance(node, int):
        return str(node)
    if isinstance(node, str):
        return node
    raise TypeError(f"a node id is a string or an integer, not {type(node).__name__}")


@lru_cache(maxsize=1 << 18)
def node_key(node: str) -> int:
    """Stable non-negative 63-bit key of a canonical node id (cached: ids repeat)."""
    digest = hashlib.blake2b(node.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF


def node_keys(nodes: Iterable[str]) -> np.ndarray:
    return np.fromiter((node_key(n) for n in nodes), dtype=np.int64)
