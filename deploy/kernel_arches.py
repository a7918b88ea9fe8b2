#!/usr/bin/env python3
"""Build mamba-ssm's and causal-conv1d's CUDA kernels for chosen GPU architectures only.

Their setup.py append their own ``-gencode`` list (with CUDA 13: sm_75, 80, 87, 90, 100,
103, 110, 120 and 121), and torch's BuildExtension then ignores ``TORCH_CUDA_ARCH_LIST``
(torch/utils/cpp_extension.py, ``_get_cuda_arch_flags``): every architecture costs
about as much nvcc time as the first. This rewrites an unpacked sdist's setup.py so that
only the ``-gencode`` pairs of the listed architectures stay (each dropped pair becomes
``pass``, so the ``if`` blocks around them stay valid Python)::

    python deploy/kernel_arches.py "9.0" mamba_ssm-2.3.2.post1/setup.py causal_conv1d-1.7.0/setup.py

The list takes TORCH_CUDA_ARCH_LIST's form ("8.0;9.0", "9.0 10.0", "+PTX" ignored). The
script fails when a file has no such pairs (a new setup.py layout: check it by hand) or
none of the listed architectures. Standard library only.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

PAIR = re.compile(
    r'cc_flag\.append\("-gencode"\)\s*\n(\s*)cc_flag\.append\("arch=compute_(\d+),code=sm_(\d+)"\)'
)


def arch_codes(arch_list: str) -> set[str]:
    """'8.0;9.0+PTX' -> {'80', '90'}."""
    codes = set()
    for item in re.split(r"[;\s,]+", arch_list.strip()):
        if item:
            codes.add(item.replace("+PTX", "").replace(".", ""))
    if not codes:
        raise ValueError("no architecture given")
    return codes


def keep_arches(setup_py: str, codes: set[str]) -> tuple[str, list[str]]:
    """The setup.py text with only the listed architectures' pairs, and the kept codes."""
    kept: list[str] = []

    def replace(m: re.Match[str]) -> str:
        if m.group(2) in codes:
            kept.append(m.group(2))
            return m.group(0)
        return "pass"

    out, n = PAIR.subn(replace, setup_py)
    if n == 0:
        raise ValueError("no -gencode pairs found: the setup.py layout changed, check it by hand")
    if not kept:
        raise ValueError(f"none of the architectures {sorted(codes)} is in its list")
    ast.parse(out)  # still valid Python
    return out, kept


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    codes = arch_codes(args[0])
    for name in args[1:]:
        path = Path(name)
        text, kept = keep_arches(path.read_text(), codes)
        path.write_text(text)
        print(f"{path}: -gencode for sm_{', sm_'.join(kept)} only")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
