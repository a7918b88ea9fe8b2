"""What ``GET /v1/model`` may show of the host: no absolute paths.

An absolute path tells a caller the host's layout (user names, mount points). The
checkpoint is named by its folder, which is also what ``POST /v1/admin/reload``
takes (a path under the models directory); strings in the checkpoint's metrics that
are absolute paths (a training run records its data file) keep only their last part.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

_ABSOLUTE = re.compile(r"^(/|~|[A-Za-z]:[\\/]|\\\\)")  # POSIX, home, drive, UNC


def checkpoint_name(path: Path) -> str:
    return path.name or str(path)


def without_absolute_paths(value: Any) -> Any:
    """``value`` (JSON-like) with every absolute path string cut to its last part."""
    if isinstance(value, str):
        if _ABSOLUTE.match(value) and "\n" not in value:
            pure = PureWindowsPath(value) if "\\" in value else PurePosixPath(value)
            return pure.name or "<path>"
        return value
    if isinstance(value, dict):
        return {k: without_absolute_paths(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_absolute_paths(v) for v in value]
    return value
