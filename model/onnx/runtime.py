"""The onnxruntime backend: a drop-in for ``DygMambaLinkModel`` in ``model.streaming``.

``OnnxLinkModel`` implements ``model.protocol.ServedModel`` (``config``, ``eval()``,
``advance``, ``score_states``, ``score_nodes``) on top of ``step(states, ev)``. Tensors in and out are torch (on the CPU); inside, numpy arrays go
through two onnxruntime sessions (``step.onnx`` and ``readout_head.onnx``, see
``model.onnx.export``). The per-node bookkeeping of a step (t_last <- t, last_seq <- seq,
n_events + 1) happens here, in the same dtypes as the PyTorch model.

``advance`` is the segmented step (one run of the step graph per event rank);
``scan`` is provided as a fold of ``step``.

Providers: ``CUDAExecutionProvider`` then ``CPUExecutionProvider``, filtered to what
``onnxruntime.get_available_providers()`` lists (with onnxruntime-gpu the scoring graph
runs on the CUDA provider). onnxruntime-gpu lists CUDA whenever it was compiled in and
falls back to the CPU when CUDA cannot start, so ``providers`` reports what the sessions
actually use (``InferenceSession.get_providers()``, read after the sessions are created),
``fallen_back`` what was asked for and did not start (logged as a warning).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..checkpoint import LoadedCheckpoint, load_checkpoint
from ..config import ModelConfig
from ..events import EventInputs, NodeEvent, advance_stepwise
from ..node_state import NeighbourLists, NodeStates
from ..pair_features import pair_feature_dim, pair_id_columns
from ..streaming import score_gathered
from .export import export_loaded
from .manifest import READOUT_HEAD_OUTPUTS, STEP_OUTPUTS, OnnxManifestError, read_manifest

log = logging.getLogger("dygserve")

PREFERRED_PROVIDERS = ("CUDAExecutionProvider", "CPUExecutionProvider")


def available_providers(preferred: Sequence[str] = PREFERRED_PROVIDERS) -> list[str]:
    import onnxruntime as ort

    have = set(ort.get_available_providers())
    chosen = [p for p in preferred if p in have]
    if not chosen:
        raise RuntimeError(
            f"none of the providers {list(preferred)} is available (have {sorted(have)})"
        )
    return chosen


def _np(x: torch.Tensor, dtype: Any) -> np.ndarray:
    return np.ascontiguousarray(x.detach().cpu().numpy(), dtype=dtype)


class OnnxLinkModel:
    """Step and score of a checkpoint through onnxruntime (same numbers as PyTorch)."""

    def __init__(
        self,
        config: ModelConfig,
        version: str,
        onnx_dir: str | Path,
        providers: Sequence[str] | None = None,
        intra_op_threads: int = 1,
    ) -> None:
        """Open the sessions of an export folder whose manifest is of model ``version``."""
        import onnxruntime as ort

        d = Path(onnx_dir)
        manifest = read_manifest(d, expected_version=version)
        if manifest.get("config") != config.model_dump(mode="json"):
            raise OnnxManifestError(f"ONNX export in {d} was made from a different model config")
        self.config = config
        self.version = version
        self.manifest = manifest
        requested = available_providers(providers or PREFERRED_PROVIDERS)
        so = ort.SessionOptions()
        so.intra_op_num_threads = intra_op_threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # Sessions hold their graphs in memory: the folder may go away afterwards.
        self._step = ort.InferenceSession(
            (d / manifest["graphs"]["step"]["file"]).read_bytes(), so, providers=requested
        )
        self._readout = ort.InferenceSession(
            (d / manifest["graphs"]["readout_head"]["file"]).read_bytes(), so, providers=requested
        )
        self._step_inputs = {i.name for i in self._step.get_inputs()}
        self._readout_inputs = {i.name for i in self._readout.get_inputs()}
        for sess, graph in ((self._step, "step"), (self._readout, "readout_head")):
            listed = [i["name"] for i in manifest["graphs"][graph]["inputs"]]
            if [i.name for i in sess.get_inputs()] != listed:
                raise OnnxManifestError(f"{graph} graph inputs differ from the manifest's {listed}")
        self.requested_providers = tuple(requested)
        self.session_providers = {
            "step": tuple(self._step.get_providers()),
            "readout_head": tuple(self._readout.get_providers()),
        }
        if self.fallen_back:
            # onnxruntime-gpu lists CUDA among its available providers whenever it was
            # compiled in; a session still falls back to the CPU (with an error line of its
            # own) when the CUDA/cuDNN libraries it wants cannot be loaded.
            log.warning(
                "onnxruntime: asked for %s, the sessions run on %s (providers %s could not start)",
                list(self.requested_providers),
                self.session_providers,
                list(self.fallen_back),
            )

    # ----- construction ------------------------------------------------------------------
    @classmethod
    def from_loaded(
        cls,
        checkpoint: LoadedCheckpoint,
        onnx_dir: str | Path | None = None,
        providers: Sequence[str] | None = None,
        intra_op_threads: int = 1,
    ) -> OnnxLinkModel:
        """From an already loaded checkpoint; exports to a temporary folder if no ``onnx_dir``."""
        if onnx_dir is not None:
            return cls(checkpoint.config, checkpoint.version, onnx_dir, providers, intra_op_threads)
        with tempfile.TemporaryDirectory(prefix="dygserve-onnx-") as tmp:
            export_loaded(checkpoint, Path(tmp))
            return cls(checkpoint.config, checkpoint.version, tmp, providers, intra_op_threads)

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint_dir: str | Path,
        onnx_dir: str | Path | None = None,
        providers: Sequence[str] | None = None,
        intra_op_threads: int = 1,
    ) -> OnnxLinkModel:
        """Load (and verify) a checkpoint; open ``onnx_dir`` or export to a temporary folder.

        Refuses (``OnnxManifestError``) an export whose manifest names another model
        version, whose config differs, or whose graph files do not match their sha256.
        """
        return cls.from_loaded(
            load_checkpoint(checkpoint_dir), onnx_dir, providers, intra_op_threads
        )

    # ----- the served-model protocol (model.protocol.ServedModel) ---------------------
    def eval(self) -> OnnxLinkModel:
        return self

    def advance(self, states: NodeStates, per_node: Sequence[Sequence[NodeEvent]]) -> NodeStates:
        """One run of the step graph per event rank (``events.advance_stepwise``)."""
        return advance_stepwise(self, states, per_node)

    def score_nodes(
        self,
        states: NodeStates,
        lists: NeighbourLists,
        keys: torch.Tensor,
        iu: torch.Tensor,
        iv: torch.Tensor,
        tau: torch.Tensor,
    ) -> torch.Tensor:
        """The graph scores whole pairs: gather each pair's states, then score."""
        return score_gathered(self, states, lists, keys, iu, iv, tau)

    @property
    def fallen_back(self) -> tuple[str, ...]:
        """Providers asked for that some session does not run on (e.g. CUDA without its
        libraries), in the order asked; empty when every session got what it asked for."""
        running = set(self.session_providers["step"]) & set(self.session_providers["readout_head"])
        return tuple(p for p in self.requested_providers if p not in running)

    @property
    def providers(self) -> tuple[str, ...]:
        """Providers the step session really runs on (first = preferred), e.g. ('CPUExecutionProvider',)."""
        return self.session_providers["step"]

    def step(self, states: NodeStates, ev: EventInputs) -> NodeStates:
        """Apply one event to each of N nodes (ev fields shaped (N,)), as ``DygMambaLinkModel.step``."""
        n = len(states)
        t = ev.t.detach().cpu().to(torch.float64)
        if n == 0:
            h, conv = states.h.detach().cpu().clone(), states.conv.detach().cpu().clone()
        else:
            feed = {
                "h": _np(states.h, np.float32),
                "conv": _np(states.conv, np.float32),
                "t_last": _np(states.t_last, np.float64),
                "other_key": _np(ev.other_key, np.int64),
                "role": _np(ev.role, np.int64),
                "features": _np(ev.features, np.float32).reshape(n, self.config.edge_feature_dim),
                "t": _np(t, np.float64),
            }
            h_new, conv_new = self._step.run(
                list(STEP_OUTPUTS), {k: v for k, v in feed.items() if k in self._step_inputs}
            )
            h, conv = torch.from_numpy(h_new), torch.from_numpy(conv_new)
        return NodeStates(
            h=h,
            conv=conv,
            t_last=t.clone(),
            last_seq=ev.seq.detach().cpu().to(torch.int64).clone(),
            n_events=states.n_events.detach().cpu() + 1,
        )

    def score_states(
        self,
        su: NodeStates,
        sv: NodeStates,
        tau: torch.Tensor,
        pair: torch.Tensor | None,
        pair_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits (N,) float32 of N pairs from their states at query times tau."""
        n = int(tau.shape[0])
        if n == 0:
            return torch.zeros(0, dtype=torch.float32)
        if pair is None:
            if self.config.use_pair_features:
                raise ValueError("this model uses pair features: pass them")
            # unused by the graph, which has no pair input without pair features
            pair_np = np.zeros((n, pair_feature_dim(self.config)), dtype=np.float32)
        else:
            pair_np = _np(pair, np.float32)
        if pair_ids is None:
            if self.config.identity_match_dim:
                raise ValueError("this model matches node ids: pass pair_ids")
            ids_np = np.zeros(
                (n, pair_id_columns(self.config.identity_match_depth)), dtype=np.int64
            )  # unused by the graph
        else:
            ids_np = _np(pair_ids, np.int64)
        feed = {
            "h_u": _np(su.h, np.float32),
            "t_last_u": _np(su.t_last, np.float64),
            "h_v": _np(sv.h, np.float32),
            "t_last_v": _np(sv.t_last, np.float64),
            "tau": _np(tau, np.float64),
            "pair": pair_np,
            "pair_ids": ids_np,
        }
        (logits,) = self._readout.run(
            list(READOUT_HEAD_OUTPUTS), {k: v for k, v in feed.items() if k in self._readout_inputs}
        )
        return torch.from_numpy(logits)

    # ----- for completeness -------------------------------------------------------------
    def scan(
        self,
        states0: NodeStates,
        ev: EventInputs,
        lengths: torch.Tensor,
        return_states: bool = False,
        chunk: int = 16,
    ) -> tuple[NodeStates, torch.Tensor | None]:
        """Padded (N, T) events folded through ``step`` (no per-position states)."""
        if return_states:
            raise NotImplementedError("the ONNX backend does not return per-position states")
        cur = states0.clone()
        for k in range(int(ev.t.shape[1]) if ev.t.dim() == 2 else 0):
            rows = torch.nonzero(lengths > k).squeeze(1)
            if rows.numel() == 0:
                break
            step_in = EventInputs(
                ev.other_key[rows, k],
                ev.role[rows, k],
                ev.features[rows, k],
                ev.t[rows, k],
                ev.seq[rows, k],
            )
            new = self.step(cur.select(rows), step_in)
            cur.h[rows], cur.conv[rows] = new.h, new.conv
            cur.t_last[rows], cur.last_seq[rows], cur.n_events[rows] = (
                new.t_last,
                new.last_seq,
                new.n_events,
            )
        return cur, None

    def __repr__(self) -> str:
        return f"OnnxLinkModel(version={self.version}, providers={list(self.providers)}, exporter={self.manifest.get('exporter')})"
