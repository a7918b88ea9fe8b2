"""Which implementation of the three kernels a path calls: mamba-ssm's CUDA/Triton
functions, or their CPU twin (``model.kernels.reference``), behind one record.

mamba-ssm imports only where its CUDA extension was built (``import mamba_ssm`` does a
bare ``import selective_scan_cuda``; ``../shared/reference/feasibility.md``), and its
Triton step needs CUDA tensors, so loading it is a probe that returns the reason it
failed instead of raising. causal-conv1d is optional inside mamba-ssm too: without it,
or for a conv width its kernel does not take (2-4), the conv falls back to the twin
(plain torch, which runs on CUDA tensors as well).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from .reference import causal_conv1d_ref, selective_scan_ref, selective_state_update_ref

# causal_conv1d_fn's kernel is compiled for these widths only.
CAUSAL_CONV1D_WIDTHS = (2, 3, 4)


@dataclass(frozen=True)
class KernelOps:
    """The three functions, each with mamba-ssm's signature."""

    name: str  # "mamba-ssm" or "twin"
    selective_scan: Any  # selective_scan_fn(u, delta, A, B, C, ..., return_last_state)
    causal_conv1d: Any | None  # causal_conv1d_fn(x, weight, bias, ..., activation); None: twin
    selective_state_update: Any  # selective_state_update(state, x, dt, A, B, C, ...)

    def conv_for(self, width: int) -> Any:
        """The causal conv for a kernel width: the CUDA one where it exists, else the twin."""
        if self.causal_conv1d is not None and width in CAUSAL_CONV1D_WIDTHS:
            return self.causal_conv1d
        return causal_conv1d_ref


TWIN_OPS = KernelOps("twin", selective_scan_ref, causal_conv1d_ref, selective_state_update_ref)


@functools.cache
def load_mamba_ops() -> tuple[KernelOps | None, str]:
    """(mamba-ssm's kernels, "") where they import, else (None, why not). Cached: the
    probe imports triton and transformers, seconds the first time."""
    try:
        from mamba_ssm.ops.selective_scan_interface import selective_scan_fn
        from mamba_ssm.ops.triton.selective_state_update import selective_state_update
    except Exception as exc:  # ImportError, or an extension that fails to load
        return None, f"mamba-ssm not importable: {type(exc).__name__}: {exc}"[:300]
    try:
        from causal_conv1d import causal_conv1d_fn
    except Exception:  # optional: the conv then runs in torch
        causal_conv1d_fn = None
    step = _zeros_for_missing_d_and_dt_bias(selective_state_update)
    return KernelOps("mamba-ssm", selective_scan_fn, causal_conv1d_fn, step), ""


def _zeros_for_missing_d_and_dt_bias(selective_state_update: Any) -> Any:
    """mamba-ssm 2.3.2's ``selective_state_update`` passes its strides to Triton as
    ``*(D.stride(0), D.stride(1)) if D is not None else 0``, which raises
    ``TypeError: Value after * must be an iterable`` whenever D or dt_bias is None (found
    on an H100, 2026-11-27). Zeros of their shape add nothing to the step, so the model
    calls it with those instead of None."""

    @functools.wraps(selective_state_update)
    def step(
        state: Any,
        x: Any,
        dt: Any,
        A: Any,
        B: Any,
        C: Any,
        D: Any = None,
        z: Any = None,
        dt_bias: Any = None,
        dt_softplus: bool = False,
    ) -> Any:
        if D is None:
            D = _zeros(x.shape[-1], x.device, x.dtype)
        if dt_bias is None:
            dt_bias = _zeros(dt.shape[-1], dt.device, dt.dtype)
        return selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)

    return step


@functools.lru_cache(maxsize=16)
def _zeros(n: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """One zero vector per shape and device, shared: the step is called once per event
    rank of every ingest, and the kernel only reads D and dt_bias."""
    return torch.zeros(n, device=device, dtype=dtype)
