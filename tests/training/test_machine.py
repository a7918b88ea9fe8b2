"""The machine line of the results and benchmark reports."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from training.machine import cpu_name, describe_machine


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="needs Linux's /proc/cpuinfo")
def test_cpu_name_is_the_model_name_not_the_architecture() -> None:
    names = [
        line.split(":", 1)[1].strip()
        for line in Path("/proc/cpuinfo").read_text().splitlines()
        if line.startswith("model name")
    ]
    if not names:
        pytest.skip("this kernel's /proc/cpuinfo names no model (some ARM machines)")
    assert cpu_name() == names[0]


def test_describe_machine_names_cores_and_torch() -> None:
    machine = describe_machine()
    assert machine["cores"] == os.cpu_count()
    assert machine["torch"] == f"torch {torch.__version__}"
    assert machine["cpu"]
