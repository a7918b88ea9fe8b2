"""What a measurement ran on: the CPU's name (not only its architecture), its cores and
torch's version, for the headers of the results and benchmark reports, whose figures
mean little without the machine."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import torch


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo where there is one (two VMs of the same
    kind may run on an AMD EPYC one day and an Intel Xeon the next), else what
    ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe_machine() -> dict[str, Any]:
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "torch": f"torch {torch.__version__}"}
