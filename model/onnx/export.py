"""Export a checkpoint's serving hot paths to ONNX for the onnxruntime backend.

Two graphs, both with a dynamic batch dimension ``batch`` (one row per node or pair):

* ``step.onnx``: one event for each of N nodes, all layers: token building (hashed
  embedding of the other endpoint via int64 ``Mod``, role, "first event" flag, edge
  features), time encoding of the gap, and every SSM layer's step. The gap since
  ``t_last`` is computed *in the graph* in float64 (``IsInf``/``IsNaN``/``Where``/
  ``Sub``/``Div``/``Clip`` on doubles, all CPU kernels of onnxruntime) and cast to
  float32 only afterwards, exactly as ``DygMambaLinkModel.step``.

  inputs  h (N, n_layers, d_inner, d_state) f32, conv (N, n_layers, d_inner, d_conv-1) f32,
          t_last (N,) f64, other_key (N,) i64, role (N,) i64, features (N, F) f32, t (N,) f64
  outputs h_new, conv_new (same shapes as h, conv)

  The bookkeeping (t_last <- t, last_seq <- seq, n_events + 1) stays in the Python
  wrapper (``model.onnx.runtime.OnnxLinkModel.step``).

* ``readout_head.onnx``: logits of N pairs from cached states at query times tau:
  decay to tau (float64 gap, clamped at 0), read-out, head.

  inputs  h_u, t_last_u, h_v, t_last_v, tau (N,) f64, pair (N, 11) f32,
          pair_ids (N, 2 + 2 * identity_match_depth) i64
  outputs logits (N,) f32

  An input the config does not use (``other_key`` with ``node_hash_buckets = 0``;
  ``h_*``/``t_last_*`` with ``use_state = false``; ``pair`` with
  ``use_pair_features = false``; ``pair_ids`` with ``identity_match_dim = 0``) may be dropped by the exporter: the manifest lists
  the inputs each graph really has, and the backend feeds exactly those.

Both graphs are traced from the model's own ``step`` and ``score_states`` (not a
re-implementation), so the ONNX numbers follow the PyTorch code.

``manifest.json`` records the source model version, the exporter used (dynamo, or the
legacy TorchScript exporter when dynamo fails), the opset, the graphs' input and output
names/types/shapes, the sha256 of each ``.onnx`` file, and the largest difference from
PyTorch on a small self-check batch.

CLI::

    dygserve export-onnx --checkpoint checkpoints/default [--out DIR]
    dygserve export-onnx --bench [--checkpoint DIR]   # torch vs onnxruntime timings (model.onnx.bench)

The default output folder is ``<checkpoint>-onnx`` beside the checkpoint, never
inside it (the checkpoint folder holds only what its version hashes).
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from state_store.blob_header import NO_TIME

from ..checkpoint import LoadedCheckpoint, load_checkpoint
from ..events import EventInputs
from ..link_model import DygMambaLinkModel
from ..node_state import NodeStates
from ..pair_features import pair_feature_dim, pair_id_columns
from .manifest import (
    BATCH_DIM,
    MANIFEST_FILE,
    MANIFEST_FORMAT,
    READOUT_HEAD_FILE,
    READOUT_HEAD_OUTPUTS,
    STEP_FILE,
    STEP_OUTPUTS,
    sha256_file,
)

# Sample batch for tracing: not 0 or 1, which torch.export would specialise.
_SAMPLE_N = 5
# The export self-check: ORT vs torch on the sample batch.
_SELF_CHECK_TOL = 1e-4


class OnnxExportError(RuntimeError):
    """Neither exporter produced a graph that reproduces the PyTorch model."""


# ===================================================================== graph modules
class StepGraph(nn.Module):
    """``DygMambaLinkModel.step`` with tensors in, (h, conv) out; bookkeeping dropped."""

    def __init__(self, model: DygMambaLinkModel) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        h: torch.Tensor,
        conv: torch.Tensor,
        t_last: torch.Tensor,
        other_key: torch.Tensor,
        role: torch.Tensor,
        features: torch.Tensor,
        t: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # last_seq / n_events / seq only feed the bookkeeping, which the exporter
        # removes as dead code: any int64 (N,) tensor stands in for them.
        states = NodeStates(h=h, conv=conv, t_last=t_last, last_seq=other_key, n_events=other_key)
        new = self.model.step(
            states,
            EventInputs(other_key=other_key, role=role, features=features, t=t, seq=other_key),
        )
        return new.h, new.conv


class ReadoutHeadGraph(nn.Module):
    """``DygMambaLinkModel.score_states``: decay, read-out and head of N pairs."""

    def __init__(self, model: DygMambaLinkModel) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        h_u: torch.Tensor,
        t_last_u: torch.Tensor,
        h_v: torch.Tensor,
        t_last_v: torch.Tensor,
        tau: torch.Tensor,
        pair: torch.Tensor,
        pair_ids: torch.Tensor,
    ) -> torch.Tensor:
        # score_states reads only h and t_last of a state; conv is never touched.
        su = NodeStates(h=h_u, conv=h_u, t_last=t_last_u, last_seq=h_u, n_events=h_u)
        sv = NodeStates(h=h_v, conv=h_v, t_last=t_last_v, last_seq=h_v, n_events=h_v)
        return self.model.score_states(su, sv, tau, pair, pair_ids)


# ===================================================================== sample inputs
def sample_step_inputs(
    model: DygMambaLinkModel, n: int = _SAMPLE_N, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Step inputs of n nodes: some never seen (t_last = -inf), some with history."""
    c = model.config
    g = torch.Generator().manual_seed(seed)
    scale = c.time_norm.scale
    t_last = torch.rand(n, generator=g, dtype=torch.float64) * 1000.0 * scale + 1.0e6
    t_last[::3] = NO_TIME
    return {
        "h": torch.randn(n, c.n_layers, c.d_inner, c.d_state, generator=g),
        "conv": torch.randn(n, c.n_layers, c.d_inner, c.d_conv - 1, generator=g),
        "t_last": t_last,
        "other_key": torch.randint(0, 2**62, (n,), generator=g, dtype=torch.int64),
        "role": torch.randint(0, 2, (n,), generator=g, dtype=torch.int64),
        "features": torch.randn(n, c.edge_feature_dim, generator=g),
        "t": torch.where(torch.isfinite(t_last), t_last, 1.0e6)
        + torch.rand(n, generator=g, dtype=torch.float64) * 10.0 * scale,
    }


def sample_readout_inputs(
    model: DygMambaLinkModel, n: int = _SAMPLE_N, seed: int = 1
) -> dict[str, torch.Tensor]:
    c = model.config
    g = torch.Generator().manual_seed(seed)
    scale = c.time_norm.scale
    t_u = torch.rand(n, generator=g, dtype=torch.float64) * 100.0 * scale + 1.0e6
    t_v = torch.rand(n, generator=g, dtype=torch.float64) * 100.0 * scale + 1.0e6
    t_u[::3] = NO_TIME
    t_v[1::4] = NO_TIME
    tau = (
        torch.rand(n, generator=g, dtype=torch.float64) * 200.0 * scale + 1.0e6
    )  # some before t_last
    pair_ids = torch.randint(
        0, 2**62, (n, pair_id_columns(c.identity_match_depth)), generator=g, dtype=torch.int64
    )
    pair_ids[::2, 2] = pair_ids[1::3, -1] = -1  # no (or no older) neighbour
    return {
        "h_u": torch.randn(n, c.n_layers, c.d_inner, c.d_state, generator=g),
        "t_last_u": t_u,
        "h_v": torch.randn(n, c.n_layers, c.d_inner, c.d_state, generator=g),
        "t_last_v": t_v,
        "tau": tau,
        "pair": torch.randn(n, pair_feature_dim(c), generator=g),
        "pair_ids": pair_ids,
    }


# ===================================================================== export
@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Silence the exporters' progress lines, deprecation and registration warnings."""
    loggers = [
        logging.getLogger(name)
        for name in ("torch.onnx", "torch.export", "torch._export", "onnxscript")
    ]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with contextlib.redirect_stdout(sys.stderr):
                yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _export_one(
    module: nn.Module,
    inputs: dict[str, torch.Tensor],
    output_names: Sequence[str],
    path: Path,
    dynamo: bool,
    opset: int | None,
) -> None:
    names = list(inputs)
    args = tuple(inputs[k] for k in names)
    kwargs: dict[str, Any] = {
        "input_names": names,
        "output_names": list(output_names),
        "dynamo": dynamo,
    }
    if opset is not None:
        kwargs["opset_version"] = opset
    if dynamo:
        batch = torch.export.Dim(BATCH_DIM, min=1, max=1 << 30)
        kwargs["dynamic_shapes"] = {k: {0: batch} for k in names}
        kwargs["verbose"] = False
        kwargs["external_data"] = False
    else:
        kwargs["dynamic_axes"] = {k: {0: BATCH_DIM} for k in [*names, *output_names]}
    with _quiet_exporter(), torch.no_grad():
        torch.onnx.export(module, args, str(path), **kwargs)


def _graph_info(path: Path) -> dict[str, Any]:
    import onnx

    proto = onnx.load(str(path))
    onnx.checker.check_model(proto)

    def values(vs: Any) -> list[dict[str, Any]]:
        out = []
        for v in vs:
            tt = v.type.tensor_type
            dims = [d.dim_param if d.dim_param else int(d.dim_value) for d in tt.shape.dim]
            out.append(
                {
                    "name": v.name,
                    "dtype": onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name,
                    "shape": dims,
                }
            )
        return out

    opset = next(int(o.version) for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    return {
        "opset": opset,
        "inputs": values(proto.graph.input),
        "outputs": values(proto.graph.output),
    }


def _max_diff_vs_torch(
    path: Path, module: nn.Module, inputs: dict[str, torch.Tensor], output_names: Sequence[str]
) -> float:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in sess.get_inputs()}
    got = sess.run(list(output_names), {k: v.numpy() for k, v in inputs.items() if k in wanted})
    with torch.no_grad():
        ref = module(*inputs.values())
    ref = ref if isinstance(ref, tuple) else (ref,)
    worst = 0.0
    for a, b in zip(got, ref, strict=True):
        b = b.numpy()
        if a.shape != b.shape:
            return float("inf")
        # Relative to the reference's magnitude, as the parity tests measure (abs + rel).
        worst = max(worst, float(np.max(np.abs(a - b) / (1.0 + np.abs(b)), initial=0.0)))
    return worst


def _export_graph(
    name: str,
    module: nn.Module,
    inputs: dict[str, torch.Tensor],
    output_names: Sequence[str],
    path: Path,
    exporter: str,
    opset: int | None,
) -> dict[str, Any]:
    """Export one graph with dynamo (then legacy if it fails) and self-check it."""
    tries = {"auto": [True, False], "dynamo": [True], "torchscript": [False]}[exporter]
    errors: dict[str, str] = {}
    for dynamo in tries:
        kind = "dynamo" if dynamo else "torchscript"
        try:
            path.unlink(missing_ok=True)
            _export_one(module, inputs, output_names, path, dynamo, opset)
            info = _graph_info(path)
            diff = _max_diff_vs_torch(path, module, inputs, output_names)
            if not diff <= _SELF_CHECK_TOL:
                raise OnnxExportError(
                    f"ORT differs from torch by {diff:.3g} on the self-check batch"
                )
        except Exception as exc:  # any exporter/validation failure: try the next exporter
            errors[kind] = f"{type(exc).__name__}: {exc}"[:500]
            continue
        record = {"file": path.name, "exporter": kind, **info, "self_check_max_diff": diff}
        if errors:
            record["fallback_from"] = errors
        return record
    raise OnnxExportError(f"could not export {name}: {errors}")


def default_out_dir(checkpoint_dir: str | Path) -> Path:
    ck = Path(checkpoint_dir).resolve()
    return ck.parent / f"{ck.name}-onnx"


def export_loaded(
    checkpoint: LoadedCheckpoint,
    out_dir: str | Path,
    exporter: str = "auto",
    opset: int | None = None,
) -> dict[str, Any]:
    """Export a loaded checkpoint to ``out_dir``; returns (and writes) the manifest."""
    out = Path(out_dir).resolve()
    ck = checkpoint.path.resolve()
    if out == ck or ck in out.parents:
        raise ValueError(f"ONNX output {out} must not be inside the checkpoint folder {ck}")
    if exporter not in ("auto", "dynamo", "torchscript"):
        raise ValueError(f"exporter must be auto, dynamo or torchscript, not {exporter!r}")
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST_FILE).unlink(missing_ok=True)  # no stale manifest beside new graphs
    model = checkpoint.model.eval()
    graphs = {
        "step": _export_graph(
            "step",
            StepGraph(model).eval(),
            sample_step_inputs(model),
            STEP_OUTPUTS,
            out / STEP_FILE,
            exporter,
            opset,
        ),
        "readout_head": _export_graph(
            "readout_head",
            ReadoutHeadGraph(model).eval(),
            sample_readout_inputs(model),
            READOUT_HEAD_OUTPUTS,
            out / READOUT_HEAD_FILE,
            exporter,
            opset,
        ),
    }
    for g in graphs.values():
        g["sha256"] = sha256_file(out / g["file"])
    import onnx
    import onnxruntime

    kinds = {g["exporter"] for g in graphs.values()}
    manifest = {
        "format": MANIFEST_FORMAT,
        "model_version": checkpoint.version,
        "checkpoint": str(ck),
        "config": checkpoint.config.model_dump(mode="json"),
        "exporter": kinds.pop() if len(kinds) == 1 else "mixed",
        "opset": max(g["opset"] for g in graphs.values()),
        "batch_dim": BATCH_DIM,
        "graphs": graphs,
        "versions": {
            "torch": torch.__version__,
            "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__,
        },
    }
    tmp = out / (MANIFEST_FILE + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    tmp.replace(out / MANIFEST_FILE)
    return manifest


def export_onnx(
    checkpoint_dir: str | Path,
    out_dir: str | Path | None = None,
    exporter: str = "auto",
    opset: int | None = None,
) -> dict[str, Any]:
    """Load a checkpoint (checksums verified) and export its step and read-out/head graphs.

    ``out_dir`` defaults to ``<checkpoint>-onnx`` beside the checkpoint. ``exporter``:
    "auto" (dynamo, falling back to the legacy TorchScript exporter), "dynamo" or
    "torchscript". Returns the manifest (also written to ``out_dir/manifest.json``).
    """
    out = default_out_dir(checkpoint_dir) if out_dir is None else Path(out_dir)
    return export_loaded(load_checkpoint(checkpoint_dir), out, exporter=exporter, opset=opset)
