"""Which model version serves, and which versions may hold stale states.

Two small records kept in the store's log partition (so that one Lua call can
update them with the events they describe):

* ``ServingModel``: THE serving version, one key that every worker and replica
  follows (DESIGN "Decisions": ``POST /v1/admin/reload`` changes it for all of them).
  It names the checkpoint by its path relative to the models directory, so that
  replicas with the same folder layout load the same bytes, and by its version, so
  that a replica which finds other bytes there refuses them instead of serving
  something else.
* ``VersionMarks``: per model version, the highest log seq that an applier running
  that version marked applied. An event marked applied by version W may be missing
  from the blobs of every other version V (V was not serving, or a replica still ran
  W in the mixed-version window). So every event with a seq above
  ``missed_upto(V)`` = the highest mark of the *other* versions was either applied by
  V or is still pending, and a blob of V whose watermark is at least that bound is
  current (modulo pending events, as always). Only blobs below the bound need the
  check against the node's history: none at all while a single version has ever
  applied events, which is what keeps the warm path free.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

NO_MARK = -1  # no other version has marked anything: no blob can be stale


@dataclass(frozen=True)
class ServingModel:
    version: str  # 16 hex digits (model.checkpoint)
    checkpoint: str  # the folder, relative to the models directory (posix)

    def encode(self) -> bytes:
        return orjson.dumps({"version": self.version, "checkpoint": self.checkpoint})

    @classmethod
    def decode(cls, raw: bytes | str | None) -> ServingModel | None:
        if raw is None:
            return None
        data = orjson.loads(raw)
        return cls(str(data["version"]), str(data["checkpoint"]))


@dataclass(frozen=True)
class VersionMarks:
    applied_max: dict[str, int] = field(default_factory=dict)  # version -> highest seq it marked

    def missed_upto(self, version: str) -> int:
        """Events with a seq at or below this may be missing from ``version``'s blobs."""
        return max(
            (seq for v, seq in self.applied_max.items() if v != version),
            default=NO_MARK,
        )

    def with_mark(self, version: str, seq: int) -> VersionMarks:
        """These marks plus one apply of ``version`` up to ``seq`` (what the store
        records; a process adds its own applies at once, without waiting for a poll)."""
        if seq <= self.applied_max.get(version, NO_MARK):
            return self
        return VersionMarks({**self.applied_max, version: seq})

    def merged(self, other: VersionMarks) -> VersionMarks:
        """The higher mark of each version (marks only ever rise)."""
        out = dict(self.applied_max)
        for v, seq in other.applied_max.items():
            out[v] = max(seq, out.get(v, NO_MARK))
        return VersionMarks(out)


@dataclass(frozen=True)
class ServingState:
    """What one poll of the store reads, in one round trip."""

    serving: ServingModel | None
    marks: VersionMarks
