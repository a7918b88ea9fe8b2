"""Run the real service (`python -m service.cli serve`, uvicorn) in its own process
on a free loopback port, for tests that talk to it over HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from .redis_server import free_port

REPO = Path(__file__).resolve().parents[2]


@dataclass
class ServiceProcess:
    proc: subprocess.Popen
    url: str
    log_path: Path

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60.0, **kwargs)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode


def start_service(
    workdir: Path, env: dict[str, str] | None = None, timeout: float = 60.0
) -> ServiceProcess:
    port = free_port()
    log_path = Path(workdir) / f"service-{port}.log"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DYGSERVE_")}
    full_env.update(
        {"DYGSERVE_HOST": "127.0.0.1", "DYGSERVE_PORT": str(port), "PYTHONUNBUFFERED": "1"}
    )
    full_env.update(env or {})
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--log-level", "warning"],
            cwd=REPO,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    svc = ServiceProcess(proc, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"service exited with {proc.returncode}:\n{svc.log()}")
        try:
            if httpx.get(f"{svc.url}/readyz", timeout=1.0).status_code == 200:
                return svc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    svc.stop(signal.SIGKILL)
    raise RuntimeError(f"service not ready after {timeout}s:\n{svc.log()}")
