"""The onnxruntime backend computes the same numbers as the PyTorch model.

Two checkpoints (a small random 2-layer one with edge features, and the bundled
checkpoints/default) are exported with the default exporter (dynamo), then the first
2,000 real UCI events are streamed through ``model.streaming.advance`` and
``model.streaming.score`` with the torch model and with ``OnnxLinkModel``, each on its
own trajectory: states and logits agree within 1e-5 (abs + rel) after every batch.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from model.checkpoint import load_checkpoint, save_checkpoint
from model.config import ModelConfig
from model.events import EventInputs, NodeEvent, endpoint_events
from model.link_model import DygMambaLinkModel
from model.node_ids import node_keys
from model.node_state import NodeStates
from model.onnx.cli import main
from model.onnx.export import (
    default_out_dir,
    export_onnx,
    sample_readout_inputs,
    sample_step_inputs,
)
from model.onnx.manifest import MANIFEST_FILE, STEP_INPUTS, OnnxManifestError, read_manifest
from model.onnx.runtime import OnnxLinkModel
from model.pair_features import PAD_KEY
from model.role_counts import advance_records, empty_records
from model.streaming import NeighbourLists, advance, score
from model.transition_counts import (
    DenseTransitions,
    add_transitions,
    counterpart_previous_two,
    empty_counts,
    pair_keys,
)
from training.data import read_edge_stream

RTOL, ATOL = 1e-5, 1e-5
REPO = Path(__file__).resolve().parents[3]
DEFAULT_CHECKPOINT = REPO / "checkpoints" / "default"
N_EVENTS, BATCH = 2000, 100


@pytest.fixture(scope="module")
def small_checkpoint(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    model = DygMambaLinkModel(
        ModelConfig(
            edge_feature_dim=2,
            n_layers=2,
            d_model=16,
            d_state=8,
            identity_match_dim=8,
            identity_match_depth=2,
            snapshot_pair_features=True,  # a wider pair input than the default graph's,
            role_counts=True,  # wider still, from the records kept beside the lists
            role_count_unit=86400.0,
            transition_buckets=16,  # and the transition counts' columns,
            transition_decay=86400.0,  # raw and decayed,
            transition_order2=True,  # first and second order
        )
    )
    path = tmp_path_factory.mktemp("small") / "ck"
    save_checkpoint(path, model)
    return path


@pytest.fixture(scope="module")
def default_export(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("default") / "onnx"
    return out, export_onnx(DEFAULT_CHECKPOINT, out)


@pytest.fixture(scope="module")
def backends(
    small_checkpoint, default_export
) -> dict[str, tuple[DygMambaLinkModel, OnnxLinkModel]]:
    out, _ = default_export
    return {
        # onnx_dir=None: exported to a temporary folder (dynamo), then opened.
        "small": (
            load_checkpoint(small_checkpoint).model,
            OnnxLinkModel.from_checkpoint(small_checkpoint),
        ),
        "default": (
            load_checkpoint(DEFAULT_CHECKPOINT).model,
            OnnxLinkModel.from_checkpoint(DEFAULT_CHECKPOINT, out),
        ),
    }


@pytest.fixture(scope="module")
def uci(data_dir):
    stream = read_edge_stream(data_dir / "uci" / "edges.csv.gz", limit=N_EVENTS)
    ids, inverse = np.unique(
        np.concatenate([stream.src, stream.dst]).astype(str), return_inverse=True
    )
    n = len(stream)
    return {
        "src": inverse[:n],
        "dst": inverse[n:],
        "t": stream.t,
        "keys": node_keys(ids.tolist()),
        "features": np.random.default_rng(0)
        .standard_normal((n, 2))
        .astype(np.float32),  # UCI has none
    }


def _stream(model, uci) -> tuple[list[torch.Tensor], list[NodeStates], NodeStates]:
    """Score (positive + random negative per event) then ingest, batch after batch."""
    cfg = model.config
    keys, t, feats = uci["keys"], uci["t"], uci["features"][:, : cfg.edge_feature_dim]
    n_nodes, length = len(keys), cfg.neighbour_list_len
    states = NodeStates.initial(n_nodes, cfg)
    nbr_k = np.full((n_nodes, length), PAD_KEY, dtype=np.int64)
    nbr_t = np.full((n_nodes, length), np.inf, dtype=np.float64)
    counts = empty_records(n_nodes) if cfg.role_counts else None
    buckets = cfg.transition_buckets
    decay = cfg.transition_decay
    order2 = cfg.transition_order2
    moves = empty_counts(n_nodes, buckets, decay, order2) if buckets else None
    latest: dict[int, int] = {}
    before: dict[int, int] = {}

    def lists(rows: np.ndarray) -> NeighbourLists:
        held = None if counts is None else torch.from_numpy(counts[rows])
        came_from = None if moves is None else DenseTransitions(moves[rows], buckets, decay)
        return NeighbourLists(
            torch.from_numpy(nbr_k[rows]), torch.from_numpy(nbr_t[rows]), held, came_from
        )

    rng = np.random.default_rng(1)
    logits_all, touched_all = [], []
    for start in range(0, len(t), BATCH):
        idx = np.arange(start, min(start + BATCH, len(t)))
        qs = np.concatenate([uci["src"][idx], uci["src"][idx]])
        qd = np.concatenate([uci["dst"][idx], rng.integers(0, n_nodes, len(idx))])
        qt = np.concatenate([t[idx], t[idx]])
        logits_all.append(
            score(
                model,
                states.select(qs),
                states.select(qd),
                torch.from_numpy(keys[qs]),
                torch.from_numpy(keys[qd]),
                torch.from_numpy(qt),
                lists(qs),
                lists(qd),
            )
        )
        per: dict[int, list[NodeEvent]] = {}
        for e in idx.tolist():
            u, v = int(uci["src"][e]), int(uci["dst"][e])
            a, b = endpoint_events(int(keys[u]), int(keys[v]), feats[e].tolist(), float(t[e]), e)
            per.setdefault(u, []).append(a)
            per.setdefault(v, []).append(b)
        nodes = torch.tensor(list(per))
        new = advance(model, states.select(nodes), [per[int(k)] for k in nodes])
        states.h[nodes], states.conv[nodes] = new.h, new.conv
        states.t_last[nodes], states.last_seq[nodes], states.n_events[nodes] = (
            new.t_last,
            new.last_seq,
            new.n_events,
        )
        touched_all.append(new)
        if counts is not None:
            counts[nodes.numpy()] = advance_records(
                counts[nodes.numpy()], [per[int(k)] for k in nodes]
            )
        if moves is not None:
            src, dst = uci["src"][idx], uci["dst"][idx]
            p1s, p1d, p2s, p2d = counterpart_previous_two(
                keys[src].tolist(), keys[dst].tolist(), latest, before
            )
            times = np.r_[t[idx], t[idx]]
            newest = nbr_t[:, -1]
            prev = np.array(p1s + p1d, dtype=np.int64)
            pairs = pair_keys(np.array(p2s + p2d, dtype=np.int64), prev) if order2 else None
            add_transitions(moves, np.r_[src, dst], prev, buckets, decay, times, newest, pairs)
        for node, evs in per.items():
            k = min(len(evs), length)
            nbr_k[node, : length - k], nbr_t[node, : length - k] = nbr_k[node, k:], nbr_t[node, k:]
            nbr_k[node, length - k :] = [x.other_key for x in evs[-k:]]
            nbr_t[node, length - k :] = [x.t for x in evs[-k:]]
    return logits_all, touched_all, states


def _assert_states_equal(a: NodeStates, b: NodeStates) -> None:
    torch.testing.assert_close(a.h, b.h, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(a.conv, b.conv, rtol=RTOL, atol=ATOL)
    assert torch.equal(a.t_last, b.t_last) and a.t_last.dtype == b.t_last.dtype == torch.float64
    assert (
        torch.equal(a.last_seq, b.last_seq) and a.last_seq.dtype == b.last_seq.dtype == torch.int64
    )
    assert (
        torch.equal(a.n_events, b.n_events) and a.n_events.dtype == b.n_events.dtype == torch.int64
    )


@pytest.mark.parametrize("which", ["small", "default"])
def test_streaming_parity_on_uci(backends, uci, which):
    torch_model, onnx_model = backends[which]
    logits_t, touched_t, final_t = _stream(torch_model, uci)
    logits_o, touched_o, final_o = _stream(onnx_model, uci)
    assert len(logits_t) == len(logits_o) == N_EVENTS // BATCH
    for batch, (lt, lo) in enumerate(zip(logits_t, logits_o, strict=True)):
        assert lo.dtype == lt.dtype == torch.float32 and lo.shape == lt.shape
        torch.testing.assert_close(
            lo, lt, rtol=RTOL, atol=ATOL, msg=lambda m, b=batch: f"batch {b}: {m}"
        )
    for st, so in zip(touched_t, touched_o, strict=True):
        _assert_states_equal(so, st)
    _assert_states_equal(final_o, final_t)
    assert int(final_t.n_events.sum()) == 2 * N_EVENTS
    # The stream really exercised the model: states moved, logits vary.
    assert float(final_t.h.abs().max()) > 0 and float(torch.cat(logits_t).std()) > 1e-3


def test_manifest(default_export):
    out, manifest = default_export
    version = load_checkpoint(DEFAULT_CHECKPOINT).version
    assert manifest == json.loads((out / MANIFEST_FILE).read_text())
    assert manifest["model_version"] == version
    assert manifest["exporter"] in ("dynamo", "torchscript") and isinstance(manifest["opset"], int)
    step, head = manifest["graphs"]["step"], manifest["graphs"]["readout_head"]
    assert [i["name"] for i in step["inputs"]] == list(STEP_INPUTS)
    assert [o["name"] for o in step["outputs"]] == ["h_new", "conv_new"]
    assert {i["name"]: i["dtype"] for i in step["inputs"]}["t_last"] == "float64"
    assert step["inputs"][0]["shape"][0] == manifest["batch_dim"]
    assert [o["name"] for o in head["outputs"]] == ["logits"]
    assert (
        read_manifest(out, expected_version=version) == manifest
    )  # sha256 of each file checks out
    assert not (DEFAULT_CHECKPOINT / MANIFEST_FILE).exists()


def test_mismatched_or_altered_export_is_refused(small_checkpoint, default_export, tmp_path):
    out, _ = default_export
    with pytest.raises(OnnxManifestError, match="re-export"):
        OnnxLinkModel.from_checkpoint(small_checkpoint, out)  # another model's export
    forged = tmp_path / "forged"
    shutil.copytree(out, forged)
    doc = json.loads((forged / MANIFEST_FILE).read_text())
    doc["model_version"] = "0" * 16
    (forged / MANIFEST_FILE).write_text(json.dumps(doc))
    with pytest.raises(OnnxManifestError, match="re-export"):
        OnnxLinkModel.from_checkpoint(DEFAULT_CHECKPOINT, forged)
    tampered = tmp_path / "tampered"
    shutil.copytree(out, tampered)
    with open(tampered / "step.onnx", "ab") as fh:
        fh.write(b"\0")
    with pytest.raises(OnnxManifestError, match="sha256"):
        OnnxLinkModel.from_checkpoint(DEFAULT_CHECKPOINT, tampered)


def test_cpu_provider_reported(backends):
    for _, onnx_model in backends.values():
        assert "CPUExecutionProvider" in onnx_model.providers
        assert onnx_model.providers == onnx_model.session_providers["readout_head"]
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            assert onnx_model.providers == ("CPUExecutionProvider",)


def test_cuda_asked_for_but_unusable_falls_back_to_the_cpu(default_export, monkeypatch, caplog):
    """onnxruntime-gpu on a machine whose CUDA libraries it cannot load lists CUDA among
    its available providers (compiled in) and the session falls back to the CPU. Listed
    here the same way: the runtime asks for CUDA, reads the providers the sessions really
    got, reports the fallback, logs it, and scores on the CPU with the same numbers."""
    out, _ = default_export
    real = ort.get_available_providers()
    if "CUDAExecutionProvider" in real:
        pytest.skip("CUDA provider usable here: no fallback to observe")
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", *real])
    with caplog.at_level("WARNING", logger="dygserve"):
        onnx_model = OnnxLinkModel.from_checkpoint(DEFAULT_CHECKPOINT, out)
    assert onnx_model.requested_providers == ("CUDAExecutionProvider", "CPUExecutionProvider")
    assert onnx_model.providers == ("CPUExecutionProvider",)
    assert onnx_model.session_providers["readout_head"] == ("CPUExecutionProvider",)
    assert onnx_model.fallen_back == ("CUDAExecutionProvider",)
    assert "could not start" in caplog.text
    _check_batch(load_checkpoint(DEFAULT_CHECKPOINT).model, onnx_model, 16)


def test_nothing_falls_back_when_only_the_cpu_is_asked_for(backends):
    for _, onnx_model in backends.values():
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            assert onnx_model.requested_providers == ("CPUExecutionProvider",)
            assert onnx_model.fallen_back == ()


@pytest.mark.gpu
def test_cuda_provider_scores_like_torch(default_export):
    """On a GPU machine with onnxruntime-gpu: the scoring graph runs on the CUDA provider
    and its logits equal torch's within 1e-5."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip(
            "onnxruntime-gpu is not installed here (the CPU onnxruntime has no CUDA provider)"
        )
    out, _ = default_export
    onnx_model = OnnxLinkModel.from_checkpoint(DEFAULT_CHECKPOINT, out)
    # listed but not started (CUDA 13 / cuDNN 9 libraries missing) is a failure on a GPU machine
    assert onnx_model.session_providers["readout_head"][0] == "CUDAExecutionProvider", (
        f"scoring graph on {onnx_model.session_providers} (onnxruntime-gpu, CUDA 13, cuDNN 9?)"
    )
    _check_batch(load_checkpoint(DEFAULT_CHECKPOINT).model, onnx_model, 4096)


def test_cuda_provider(backends):
    torch_model, onnx_model = backends["default"]
    if "CUDAExecutionProvider" not in onnx_model.providers:
        pytest.skip(
            f"CUDAExecutionProvider not in the session providers {list(onnx_model.providers)} (no onnxruntime-gpu/CUDA)"
        )
    _check_batch(torch_model, onnx_model, 64)


def _check_batch(torch_model, onnx_model, n: int) -> None:
    s = sample_step_inputs(torch_model, n, seed=n)
    states = NodeStates(
        s["h"], s["conv"], s["t_last"], torch.zeros(n, dtype=torch.int64), torch.arange(n)
    )
    ev = EventInputs(s["other_key"], s["role"], s["features"], s["t"], torch.arange(n) + 7)
    with torch.no_grad():
        _assert_states_equal(onnx_model.step(states, ev), torch_model.step(states, ev))
    r = sample_readout_inputs(torch_model, n, seed=n + 1)
    su = NodeStates(r["h_u"], s["conv"], r["t_last_u"], states.last_seq, states.n_events)
    sv = NodeStates(r["h_v"], s["conv"], r["t_last_v"], states.last_seq, states.n_events)
    pair = r["pair"] if torch_model.config.use_pair_features else None
    ids = r["pair_ids"] if torch_model.config.identity_match_dim else None
    with torch.no_grad():
        expected = torch_model.score_states(su, sv, r["tau"], pair, ids)
    torch.testing.assert_close(
        onnx_model.score_states(su, sv, r["tau"], pair, ids), expected, rtol=RTOL, atol=ATOL
    )


def test_batch_sizes_and_empty(backends):
    torch_model, onnx_model = backends["small"]
    for n in (1, 2, 1000):
        _check_batch(torch_model, onnx_model, n)
    empty = NodeStates.initial(0, onnx_model.config)
    ev = EventInputs(
        *(torch.zeros(0, dtype=torch.int64),) * 2,
        torch.zeros(0, 2),
        torch.zeros(0, dtype=torch.float64),
        torch.zeros(0, dtype=torch.int64),
    )
    assert len(onnx_model.step(empty, ev)) == 0
    no_ids = torch.zeros(0, 4, dtype=torch.int64)
    assert onnx_model.score_states(
        empty, empty, torch.zeros(0, dtype=torch.float64), torch.zeros(0, 11), no_ids
    ).shape == (0,)


def test_cli_and_ablations_with_torchscript_exporter(tmp_path):
    # Ablations drop inputs (no hashed embedding: other_key; no pair features: pair):
    # the backend feeds what each graph really has.
    torch.manual_seed(1)
    model = DygMambaLinkModel(
        ModelConfig(
            d_model=8, d_state=4, node_hash_buckets=0, use_pair_features=False, edge_feature_dim=3
        )
    )
    ck = tmp_path / "ablation"
    save_checkpoint(ck, model)
    with pytest.raises(ValueError, match="inside the checkpoint"):
        main(["--checkpoint", str(ck), "--out", str(ck / "onnx"), "--exporter", "torchscript"])
    assert main(["--checkpoint", str(ck), "--exporter", "torchscript"]) == 0
    out = default_out_dir(ck)
    assert out == tmp_path / "ablation-onnx" and (out / MANIFEST_FILE).is_file()
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert manifest["exporter"] == "torchscript"
    assert set(f.name for f in ck.iterdir()) == {
        "config.json",
        "weights.safetensors",
        "checksums.json",
    }
    onnx_model = OnnxLinkModel.from_checkpoint(ck, out).eval()
    for n in (1, 9):
        _check_batch(load_checkpoint(ck).model, onnx_model, n)
