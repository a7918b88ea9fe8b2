"""The markers of the cluster section of docs/BENCHMARKS.md (written by
``dygserve bench cluster``, kept as is by ``bench all``): apart, so that both commands
import them without importing each other."""

from __future__ import annotations

SECTION_START = "<!-- cluster-bench:start -->"
SECTION_END = "<!-- cluster-bench:end -->"


def extract_section(text: str) -> str | None:
    """The cluster section of a BENCHMARKS.md (markers included), or None."""
    lo, hi = text.find(SECTION_START), text.find(SECTION_END)
    if lo < 0 or hi < lo:
        return None
    return text[lo : hi + len(SECTION_END)]
