"""``dygserve``: serve, train, evaluate, replay, backfill, sign-checkpoint, export-onnx, bench.

Every ``serve`` flag is also an environment variable ``DYGSERVE_<NAME>``; flags win.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile

SERVE_FLAGS = ("checkpoint", "redis_url", "host", "port", "workers", "api_key", "models_dir")


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    for name in SERVE_FLAGS:
        value = getattr(args, name)
        if value is not None:
            os.environ[f"DYGSERVE_{name.upper()}"] = str(value)
    from .settings import Settings

    settings = Settings()
    # Refuse a tampered, truncated or mismatched checkpoint here, with one clear line and
    # a non-zero exit: with several workers uvicorn's supervisor exits 0 when a worker
    # fails to start, and with one it prints a traceback.
    from model.checkpoint import CheckpointError, load_checkpoint
    from model.node_head_checkpoint import load_node_head

    try:
        loaded = load_checkpoint(settings.checkpoint, settings.checkpoint_verify_key())
        load_node_head(settings.checkpoint, loaded.version)  # a node head, where there is one
    except (CheckpointError, OSError, ValueError) as exc:  # OSError, ValueError: the key file
        print(f"error: checkpoint refused: {exc}", file=sys.stderr)
        return 2
    if settings.workers > 1:
        if settings.embedded_store:
            print(
                "error: the embedded store is in-process: several workers need --redis-url",
                file=sys.stderr,
            )
            return 2
        # prometheus-client must aggregate across worker processes.
        os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="dygserve-prom-"))
    uvicorn.run(
        "service.app:create_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_level=args.log_level,
        timeout_graceful_shutdown=30,
    )
    return 0


def _sign_checkpoint(args: argparse.Namespace) -> int:
    """Sign a checkpoint with the key the service verifies (model.signing)."""
    from model.checkpoint import CheckpointError, sign_checkpoint
    from model.signing import check_key

    try:
        if args.key_file is not None:
            key = open(args.key_file, "rb").read().strip()
        elif os.environ.get("DYGSERVE_CHECKPOINT_KEY"):
            key = os.environ["DYGSERVE_CHECKPOINT_KEY"].encode()
        else:
            print("error: give --key-file or set DYGSERVE_CHECKPOINT_KEY", file=sys.stderr)
            return 2
        path = sign_checkpoint(args.checkpoint, check_key(key))
    except (CheckpointError, OSError, ValueError) as exc:
        print(f"error: not signed: {exc}", file=sys.stderr)
        return 2
    print(f"signed: {path}")
    return 0


def _backfill(args: argparse.Namespace) -> int:
    from .backfill import backfill

    report = backfill(
        args.checkpoint,
        args.redis_url,
        batch=args.batch,
        device=args.device,
        progress=not args.no_progress,
    )
    print(report.summary())
    return 0


# Subcommands run by their own module's ``main`` (their parser sees every flag, --help
# included). Named, not imported: the offline trainer (``training``) and the tools
# that drive the service from above (``loadtests``) are layers the service does not
# import (pyproject.toml, [tool.importlinter]).
DELEGATED = {
    "train": ("training.train", "train a checkpoint offline on an edge stream"),
    "evaluate": ("training.evaluate", "evaluate a checkpoint with the DyGLib/TGB protocol"),
    "results": ("training.results", "train and evaluate on every dataset; rewrite docs/RESULTS.md"),
    "replay": (
        "loadtests.accuracy_replay",
        "stream a dataset into a running service and report AP/AUC",
    ),
    "bench": (
        "loadtests.bench",
        "benchmarks: `bench store`, `bench pipeline`, `bench reads`, `bench ingest-costs`, `bench live-eval`, `bench gpu`, `bench cluster`, `bench all`",
    ),
    "export-onnx": (
        "model.onnx.cli",
        "export step and read-out/head graphs for the onnxruntime backend",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dygserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the HTTP service")
    serve.add_argument(
        "--checkpoint", default=None, help="checkpoint dir (default checkpoints/default)"
    )
    serve.add_argument(
        "--redis-url",
        dest="redis_url",
        default=None,
        help="redis:// or redis+cluster://; none = embedded store",
    )
    serve.add_argument("--host", default=None)
    serve.add_argument("--port", type=int, default=None)
    serve.add_argument("--workers", type=int, default=None)
    serve.add_argument("--api-key", dest="api_key", default=None)
    serve.add_argument("--models-dir", dest="models_dir", default=None)
    serve.add_argument("--log-level", default="info")
    serve.set_defaults(func=_serve)

    for name, (_, helptext) in DELEGATED.items():
        sub.add_parser(name, help=helptext, add_help=False)  # dispatched in main()

    sign = sub.add_parser(
        "sign-checkpoint",
        help="write signature.json (HMAC-SHA256 over the file hashes) for DYGSERVE_CHECKPOINT_KEY",
    )
    sign.add_argument("checkpoint", help="checkpoint directory")
    sign.add_argument(
        "--key-file",
        dest="key_file",
        default=None,
        help="file holding the key (default: $DYGSERVE_CHECKPOINT_KEY)",
    )
    sign.set_defaults(func=_sign_checkpoint)

    backfill = sub.add_parser(
        "backfill", help="rebuild the states of a model version from the stored histories"
    )
    backfill.add_argument("--checkpoint", default=None)
    backfill.add_argument("--redis-url", dest="redis_url", required=True)
    backfill.add_argument(
        "--batch", type=int, default=2000, help="nodes per history read (then batched by length)"
    )
    backfill.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where the batch scan runs (auto: CUDA when torch sees a GPU)",
    )
    backfill.add_argument("--no-progress", action="store_true", help="no progress bar")
    backfill.set_defaults(func=_backfill)

    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in DELEGATED:
        module = importlib.import_module(DELEGATED[argv[0]][0])
        return int(module.main(argv[1:]) or 0)
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
