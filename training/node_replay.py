"""The causal replay behind node classification: each event's SOURCE is read at the
event's time from the states before the event, then the event is ingested.

Exact visibility, as for links (``training.replay``): the events are cut into
timestamp groups; a group's sources are read from the states after every event with
time < t (``node_head_inputs``: decay to t, read-out, activity, recent pace), then the group is
ingested with ``streaming.advance`` (``StreamReplay.ingest``), which is what the
service runs. Consecutive groups are merged into one read and one ingest while no
source of a group is touched by an earlier group of the run: a read sees only its own
node's state, so that is exactly "read group g, ingest group g" for each g.

With a frozen link model the inputs do not depend on the head, so one replay gives
the inputs of every event: the trainer fits the head on them, the evaluator applies it.
"""

from __future__ import annotations

import numpy as np
import torch

from model.link_model import DygMambaLinkModel
from model.node_head import NodeHeadConfig, node_head_inputs

from .batches import IndexedStream
from .replay import StreamReplay

# Sources read per call (each is one state decayed and read out: bounded memory).
READ_CHUNK = 4096


def source_runs(data: IndexedStream) -> list[tuple[int, int]]:
    """[start, stop) event ranges, each a run of whole timestamp groups in which no
    group's source was touched by an earlier group of the same run."""
    n = len(data)
    if n == 0:
        return []
    cuts = np.r_[0, np.flatnonzero(np.diff(data.t)) + 1, n]
    touched_in = np.full(data.num_nodes, -1, dtype=np.int64)
    runs: list[tuple[int, int]] = []
    run_id, start = 0, 0
    for g in range(len(cuts) - 1):
        a, b = int(cuts[g]), int(cuts[g + 1])
        if a > start and (touched_in[data.src[a:b]] == run_id).any():
            runs.append((start, a))
            run_id += 1
            start = a
        touched_in[data.src[a:b]] = run_id
        touched_in[data.dst[a:b]] = run_id
    runs.append((start, n))
    return runs


def collect_source_inputs(
    model: DygMambaLinkModel,
    config: NodeHeadConfig,
    data: IndexedStream,
    progress: bool = False,
) -> np.ndarray:
    """(E, input_dim) float32: each event's source's head input, read before the event."""
    model.eval()
    rep = StreamReplay(model, data)
    out = np.zeros((len(data), config.input_dim), dtype=np.float32)
    runs = source_runs(data)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(data), desc="node replay", unit="ev", mininterval=2.0)
    with torch.no_grad():
        for start, stop in runs:
            for a in range(start, stop, READ_CHUNK):
                b = min(stop, a + READ_CHUNK)
                nodes = torch.from_numpy(data.src[a:b])
                feats = torch.from_numpy(data.features[a:b]) if config.event_feature_dim else None
                lists = rep.neighbour_lists(data.src[a:b]) if config.reads_neighbour_lists else None
                out[a:b] = node_head_inputs(
                    model,
                    config,
                    rep.states.select(nodes),
                    torch.from_numpy(data.t[a:b]),
                    feats,
                    lists,
                ).numpy()
            rep.ingest(np.arange(start, stop))
            if bar is not None:
                bar.update(stop - start)
    if bar is not None:
        bar.close()
    return out
