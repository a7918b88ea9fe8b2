"""Marked sections of docs/BENCHMARKS.md that ``bench all`` keeps as they are: the
cluster section (written by ``dygserve bench cluster``) and the ingest-costs section
(figures of ``bench reads`` and ``bench ingest-costs`` with their reading, written by
hand). Apart, so that the commands import them without importing each other."""

from __future__ import annotations


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


SECTION_START, SECTION_END = markers("cluster-bench")
INGEST_COSTS = "ingest-costs"


def extract_marked(text: str, name: str) -> str | None:
    """The section ``name`` of a BENCHMARKS.md (markers included), or None."""
    start, end = markers(name)
    lo, hi = text.find(start), text.find(end)
    if lo < 0 or hi < lo:
        return None
    return text[lo : hi + len(end)]


def extract_section(text: str) -> str | None:
    """The cluster section of a BENCHMARKS.md (markers included), or None."""
    return extract_marked(text, "cluster-bench")
