"""Which task a ``train``/``evaluate`` command line asks for (a leaf module: the link
trainer and evaluator read it without importing the node-classification code)."""

from __future__ import annotations

from collections.abc import Sequence

NODE_TASK = "node-classification"


def asks_node_task(argv: Sequence[str]) -> bool:
    """Whether a train/evaluate command line names ``--task node-classification``."""
    args = list(argv)
    return f"--task={NODE_TASK}" in args or any(
        a == "--task" and b == NODE_TASK for a, b in zip(args, args[1:], strict=False)
    )
