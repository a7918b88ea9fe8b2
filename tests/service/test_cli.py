from __future__ import annotations

import subprocess
import sys

import pytest

from service.cli import DELEGATED, main


@pytest.mark.parametrize("command", sorted(DELEGATED) + ["serve", "backfill"])
def test_every_subcommand_has_help(command):
    r = subprocess.run(
        [sys.executable, "-m", "service.cli", command, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "usage" in r.stdout.lower()


def test_several_workers_need_redis(monkeypatch, capsys):
    monkeypatch.delenv("DYGSERVE_REDIS_URL", raising=False)
    monkeypatch.setenv(
        "DYGSERVE_WORKERS", "1"
    )  # restored after the test: serve writes flags to the env
    assert main(["serve", "--workers", "2"]) == 2
    assert "several workers need --redis-url" in capsys.readouterr().err
