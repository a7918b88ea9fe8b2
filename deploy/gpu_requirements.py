#!/usr/bin/env python3
"""Requirement lists for the GPU image (used by the Dockerfile's ``gpu`` target).

``onnxruntime-gpu`` replaces ``onnxruntime``: both ship the ``onnxruntime`` import
package, so installing both leaves whichever came last (usually the CPU one). The
base dependencies of pyproject.toml name neither (the ``onnx`` extra has the CPU one,
the ``gpu`` extra the GPU one), and this list never lets the CPU one in. The image
installs:

1. ``python gpu_requirements.py pyproject.toml``: the base dependencies and the
   ``gpu`` extra (``onnxruntime-gpu``), without torch (installed first, pinned), without
   any ``onnxruntime``, and without the sdist-only CUDA extensions;
2. ``python gpu_requirements.py --optional pyproject.toml``: those extensions
   (mamba-ssm, causal-conv1d), installed best effort with ``--no-build-isolation``;
3. the package itself with ``pip install --no-deps .``;

and ``python gpu_requirements.py --check-onnxruntime`` fails the build when both
distributions ended up installed. Standard library only (Python 3.11+).
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

SDIST_CUDA_EXTENSIONS = frozenset({"mamba-ssm", "causal-conv1d"})
INSTALLED_FIRST = frozenset({"torch"})


def req_name(req: str) -> str:
    """The normalised (PEP 503) distribution name of a requirement string."""
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
    if not m:
        raise ValueError(f"cannot parse requirement {req!r}")
    return re.sub(r"[-_.]+", "-", m.group(1)).lower()


def gpu_requirements(pyproject: str | Path) -> tuple[list[str], list[str]]:
    """(requirements to pip install, sdist-only CUDA extensions) for the GPU image."""
    project = tomllib.loads(Path(pyproject).read_text())["project"]
    base: list[str] = list(project["dependencies"])
    gpu: list[str] = list(project.get("optional-dependencies", {}).get("gpu", []))
    gpu_names = {req_name(r) for r in gpu}
    if "onnxruntime-gpu" not in gpu_names:
        raise SystemExit("pyproject.toml: the gpu extra must name onnxruntime-gpu")
    reqs = [r for r in base if req_name(r) not in INSTALLED_FIRST | {"onnxruntime"}]
    reqs += [r for r in gpu if req_name(r) not in SDIST_CUDA_EXTENSIONS]
    optional = [r for r in gpu if req_name(r) in SDIST_CUDA_EXTENSIONS]
    return reqs, optional


def check_onnxruntime() -> int:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for dist in ("onnxruntime", "onnxruntime-gpu"):
        try:
            found[dist] = version(dist)
        except PackageNotFoundError:
            pass
    print(f"onnxruntime distributions: {found or 'none'}")
    if len(found) > 1:
        print("ERROR: onnxruntime and onnxruntime-gpu are both installed", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("pyproject", nargs="?", default="pyproject.toml")
    p.add_argument(
        "--optional",
        action="store_true",
        help="print the sdist-only CUDA extensions on one line (for pip install)",
    )
    p.add_argument(
        "--check-onnxruntime",
        action="store_true",
        help="exit 1 when onnxruntime and onnxruntime-gpu are both installed",
    )
    a = p.parse_args(argv)
    if a.check_onnxruntime:
        return check_onnxruntime()
    reqs, optional = gpu_requirements(a.pyproject)
    if a.optional:
        # for $(...) in a shell: no quotes (they would reach pip literally), no spaces
        print(" ".join(r.replace(" ", "") for r in optional))
    else:
        print("\n".join(reqs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
