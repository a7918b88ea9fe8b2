"""deploy/gpu_check.sh runs only on a GPU machine, where a mistake costs a scarce device
run: here it is checked for what can drift without one (its shell syntax, the files it
calls, and that the tests it names hold every ``gpu``-marked test)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "gpu_check.sh"


def test_the_script_parses():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_every_repo_path_it_names_exists():
    text = SCRIPT.read_text()
    paths = set(re.findall(r"\b((?:tests|deploy|loadtests|docs)/[\w/.-]+\.(?:py|md|sh))", text))
    assert paths, "the script names no files: the pattern no longer matches it"
    assert not [p for p in paths if not (REPO / p).exists()]


def test_it_runs_every_file_that_holds_gpu_tests():
    named = set(re.findall(r"\b(tests/[\w/.-]+\.py)", SCRIPT.read_text()))
    marked = {
        str(p.relative_to(REPO))
        for p in (REPO / "tests").rglob("test_*.py")
        if p != Path(__file__).resolve() and "pytest.mark.gpu" in p.read_text()
    }
    assert marked and marked <= named
