"""``dygserve export-onnx``: export a checkpoint's graphs, or time them against torch."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from ..checkpoint import BUNDLED_CHECKPOINT
from .bench import bench
from .export import default_out_dir, export_onnx


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dygserve export-onnx", description=__doc__)
    p.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="checkpoint folder (bench default: checkpoints/default)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default: <checkpoint>-onnx beside it)",
    )
    p.add_argument("--exporter", choices=("auto", "dynamo", "torchscript"), default="auto")
    p.add_argument("--opset", type=int, default=None, help="ONNX opset (default: the exporter's)")
    p.add_argument(
        "--bench", action="store_true", help="time torch vs onnxruntime for step and score"
    )
    p.add_argument("--batches", type=int, nargs="+", default=[1, 1000], help="bench batch sizes")
    p.add_argument(
        "--threads", type=int, default=1, help="bench: torch threads and ORT intra-op threads"
    )
    a = p.parse_args(argv)
    if a.bench:
        ck = a.checkpoint or BUNDLED_CHECKPOINT
        bench(ck, a.batches, a.threads)
        return 0
    if a.checkpoint is None:
        p.error("--checkpoint is required (or --bench)")
    out = a.out or default_out_dir(a.checkpoint)
    manifest = export_onnx(a.checkpoint, out, exporter=a.exporter, opset=a.opset)
    print(
        f"exported model {manifest['model_version']} to {out} "
        f"({manifest['exporter']}, opset {manifest['opset']}): "
        + ", ".join(
            f"{g['file']} ({g['self_check_max_diff']:.1e})" for g in manifest["graphs"].values()
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
