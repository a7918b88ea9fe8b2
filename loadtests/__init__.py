"""Load generators that replay a real dataset against a running dygserve service.

- ``python -m loadtests.replay_load``: ordered event replay plus interleaved score
  queries; writes a JSON report and PNG plots.
- ``python -m loadtests.soak``: a bounded soak (the replay load, looped) that samples
  the service's RSS and Redis ``used_memory`` over time.
"""
