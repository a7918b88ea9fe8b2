"""Start real Redis servers (and a small Redis Cluster) for tests.

Each server listens on a free loopback port, keeps its files in a temp dir of its
own, persists nothing unless asked (``--save '' --appendonly no``) and runs in the
foreground as a child process, stopped at teardown. Never touches the Redis that may
already run on 6379.

    server = start_redis(tmp_path)            # server.url == "redis://127.0.0.1:PORT/0"
    cluster = start_cluster(tmp_path, 3)      # cluster.url == "redis+cluster://127.0.0.1:A"
    ...; server.flush(); server.stop()
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

REDIS_SERVER = "redis-server"
REDIS_CLI = "redis-cli"


def redis_available() -> bool:
    """True when redis-server and redis-cli are on PATH (CI installs them)."""
    return shutil.which(REDIS_SERVER) is not None and shutil.which(REDIS_CLI) is not None


def free_port(low: int = 20000, high: int = 50000) -> int:
    """A free loopback port whose cluster bus port (+10000) is free too."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not (low <= port < high):
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair found")


@dataclass
class RedisServer:
    port: int
    workdir: Path
    proc: subprocess.Popen
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(host=self.host, port=self.port, **kwargs)  # type: ignore[arg-type]

    def flush(self) -> None:
        with self.client() as c:
            c.flushall()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def _wait_ping(host: str, port: int, proc: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with redis.Redis(
                host=host, port=port, socket_timeout=0.5, socket_connect_timeout=0.5
            ) as c:
                if c.ping():
                    return True
        except redis.exceptions.RedisError:
            pass
        time.sleep(0.05)
    return False


def start_redis(
    workdir: Path,
    port: int | None = None,
    extra_args: list[str] | tuple[str, ...] = (),
    appendfsync: str | None = None,
    timeout: float = 15.0,
) -> RedisServer:
    """Start ``redis-server`` on 127.0.0.1. ``appendfsync`` ("always", "everysec")
    turns the AOF on with that policy (tests that promise no acknowledged loss use
    "always"); by default nothing persists."""
    for attempt in range(5):
        p = port or free_port()
        d = Path(workdir) / f"redis-{p}"
        d.mkdir(parents=True, exist_ok=True)
        args = [
            REDIS_SERVER,
            "--port",
            str(p),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--daemonize",
            "no",
            "--dir",
            str(d),
            "--logfile",
            str(d / "redis.log"),
            "--protected-mode",
            "no",
        ]
        if appendfsync:
            args += ["--appendonly", "yes", "--appendfsync", appendfsync]
        else:
            args += ["--appendonly", "no"]
        args += list(extra_args)
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=d)
        if _wait_ping("127.0.0.1", p, proc, timeout):
            return RedisServer(p, d, proc)
        proc.kill()
        proc.wait()
        if port is not None or attempt == 4:
            log = (
                (d / "redis.log").read_text(errors="replace")[-2000:]
                if (d / "redis.log").exists()
                else ""
            )
            raise RuntimeError(f"redis-server on port {p} did not start:\n{log}")
    raise AssertionError("unreachable")


@dataclass
class RedisClusterServers:
    servers: list[RedisServer] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.servers[0].port}"

    @property
    def ports(self) -> list[int]:
        return [s.port for s in self.servers]

    def flush(self) -> None:
        for s in self.servers:
            s.flush()

    def stop(self) -> None:
        for s in self.servers:
            s.stop()


def cluster_node_args(d: Path) -> list[str]:
    """The extra arguments of a cluster node whose files live in ``d`` (also what a
    restart of that node passes again)."""
    return [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        str(d / "nodes.conf"),
        "--cluster-node-timeout",
        "2000",
    ]


def kill_and_restart(cluster: RedisClusterServers, i: int, down_s: float = 1.0) -> None:
    """SIGKILL master ``i`` (mid-work: nothing flushed beyond what its AOF policy wrote),
    leave it down for ``down_s``, and start it again on its port, files and cluster
    config (with AOF ``always``, so nothing it acknowledged is lost)."""
    victim = cluster.servers[i]
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(10)
    time.sleep(down_s)
    d = victim.workdir.parent
    cluster.servers[i] = start_redis(
        d, port=victim.port, extra_args=cluster_node_args(d), appendfsync="always"
    )


def start_cluster(
    workdir: Path, masters: int = 3, timeout: float = 30.0, appendfsync: str | None = None
) -> RedisClusterServers:
    """Start ``masters`` cluster-enabled servers and join them (no replicas);
    ``appendfsync`` as for ``start_redis``."""
    cluster = RedisClusterServers()
    try:
        for _ in range(masters):
            port = free_port()
            d = Path(workdir) / f"cluster-{port}"
            cluster.servers.append(
                start_redis(d, port=port, extra_args=cluster_node_args(d), appendfsync=appendfsync)
            )
        addrs = [f"127.0.0.1:{s.port}" for s in cluster.servers]
        subprocess.run(
            [REDIS_CLI, "--cluster", "create", *addrs, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=timeout,
        )
        deadline = time.monotonic() + timeout
        while True:
            states = []
            for s in cluster.servers:
                with s.client() as c:
                    info = c.execute_command("CLUSTER", "INFO")
                    text = info.decode() if isinstance(info, bytes) else str(info)
                    states.append(
                        "cluster_state:ok" in text and f"cluster_known_nodes:{masters}" in text
                    )
            if all(states):
                return cluster
            if time.monotonic() > deadline:
                raise RuntimeError("cluster did not reach cluster_state:ok")
            time.sleep(0.1)
    except BaseException:
        cluster.stop()
        raise
