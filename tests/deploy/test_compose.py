"""deploy/docker-compose.yml, prometheus.yml and the Grafana provisioning, checked by
parsing them (no Docker engine needed); plus ``docker-compose config -q`` when a
docker-compose binary is installed."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML is needed to parse the compose file")

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
SERVICE = "dygserve"  # the compose service that runs the app
SERVICE_PORT = 8000


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def compose() -> dict:
    return _load(COMPOSE)


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def _as_list(cmd) -> list[str]:
    return shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]


def _env(svc: dict) -> dict[str, str]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) if "=" in e else (e, "") for e in env)
    return {k: str(v) for k, v in env.items()}


def _healthcheck_text(svc: dict) -> str:
    hc = svc["healthcheck"]
    test = hc["test"]
    return " ".join(_as_list(test))


def _mounts(svc: dict) -> list[tuple[str, str]]:
    """(source, target) of every volume entry (short or long syntax)."""
    out = []
    for v in svc.get("volumes") or []:
        if isinstance(v, str):
            parts = v.split(":")
            out.append((parts[0], parts[1]) if len(parts) > 1 else ("", parts[0]))
        else:
            out.append((v.get("source", ""), v["target"]))
    return out


def _host_path(source: str) -> Path | None:
    """A bind-mount source relative to deploy/, or None for a named volume."""
    if source.startswith((".", "/", "~")):
        return (DEPLOY / source).resolve()
    return None


def _ports(svc: dict) -> list[tuple[str, str, str]]:
    """(host ip, host port or range, container port) of every published port."""
    out = []
    for p in svc.get("ports") or []:
        if isinstance(p, dict):
            out.append((p.get("host_ip", ""), str(p.get("published", "")), str(p["target"])))
            continue
        parts = str(p).split("/")[0].split(":")
        if len(parts) == 3:
            out.append((parts[0], parts[1], parts[2]))
        elif len(parts) == 2:
            out.append(("", parts[0], parts[1]))
        else:
            out.append(("", "", parts[0]))
    return out


def _interpolate_default(value: str) -> str:
    """Compose ``${VAR:-default}`` -> default (what an empty environment gives)."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value)


# --------------------------------------------------------------------------- the stack


def test_services_present(services):
    assert {"redis", SERVICE, "prometheus", "grafana"} <= services.keys()


def test_every_service_has_a_healthcheck(services):
    for name, svc in services.items():
        hc = svc.get("healthcheck")
        assert hc and hc.get("test"), f"{name} has no healthcheck"
        assert not hc.get("disable"), name
        for key in ("interval", "timeout"):
            assert re.fullmatch(r"\d+(ms|s|m)", str(hc.get(key, ""))), (name, key)
        assert int(hc.get("retries", 0)) >= 1, name


def test_depends_on_use_conditions(services):
    for name, svc in services.items():
        deps = svc.get("depends_on") or {}
        assert isinstance(deps, dict), f"{name}: use the long depends_on form with a condition"
        for dep, spec in deps.items():
            assert dep in services, (name, dep)
            assert spec.get("condition") in (
                "service_healthy",
                "service_started",
                "service_completed_successfully",
            ), (name, dep)
    assert services[SERVICE]["depends_on"]["redis"]["condition"] == "service_healthy"
    assert services["grafana"]["depends_on"]["prometheus"]["condition"] == "service_healthy"
    assert "dygserve" in services["prometheus"]["depends_on"]


def test_redis_is_durable_and_checked(compose, services):
    r = services["redis"]
    assert str(r["image"]).split(":")[0] in ("redis", "docker.io/library/redis")
    assert str(r["image"]).split(":")[1].startswith("7")
    cmd = [_interpolate_default(c) for c in _as_list(r["command"])]
    assert cmd[0] == "redis-server"
    assert cmd[cmd.index("--appendonly") + 1] == "yes"
    assert cmd[cmd.index("--appendfsync") + 1] == "everysec"
    if "--maxmemory-policy" in cmd:  # only state blobs carry a TTL: never evict the log
        assert cmd[cmd.index("--maxmemory-policy") + 1].startswith("volatile-")
    hc = _healthcheck_text(r)
    assert "redis-cli" in hc and "ping" in hc
    named = [src for src, tgt in _mounts(r) if tgt == "/data"]
    assert named and _host_path(named[0]) is None, "Redis data should be a named volume"
    assert named[0] in (compose.get("volumes") or {})


def test_eviction_policy_and_state_ttl_agree(services):
    """volatile-* evicts only keys with a TTL, and only state blobs carry one: without a
    state TTL nothing is evictable and a full Redis refuses every write (issue 15)."""
    from service.store_info import eviction_warning

    cmd = [_interpolate_default(c) for c in _as_list(services["redis"]["command"])]
    policy = cmd[cmd.index("--maxmemory-policy") + 1] if "--maxmemory-policy" in cmd else ""
    assert "--maxmemory" in cmd, "a Redis without maxmemory grows until the host runs out"
    ttl = _interpolate_default(_env(services[SERVICE]).get("DYGSERVE_STATE_TTL_S", ""))
    assert eviction_warning(policy, float(ttl) if ttl else None) is None, (policy, ttl)
    assert policy.startswith("volatile-") and float(ttl) > 0


def test_service_definition(services):
    s = services[SERVICE]
    ctx = (DEPLOY / s["build"]["context"]).resolve()
    assert ctx == REPO
    assert (ctx / s["build"].get("dockerfile", "Dockerfile")).is_file()
    env = _env(s)
    assert env["DYGSERVE_REDIS_URL"] == "redis://redis:6379/0"
    assert int(_interpolate_default(env.get("DYGSERVE_PORT", str(SERVICE_PORT)))) == SERVICE_PORT
    replicas = int((s.get("deploy") or {}).get("replicas", 1))
    assert replicas >= 2
    hc = _healthcheck_text(s)
    assert "/readyz" in hc and f":{SERVICE_PORT}" in hc
    assert "curl" not in hc, "the slim image has no curl"
    ports = [p for p in _ports(s) if p[2] == str(SERVICE_PORT)]
    assert ports, "the service port is not published"
    host = ports[0][1]
    if "-" in host:  # one host port per replica
        lo, hi = (int(x) for x in host.split("-"))
        assert hi - lo + 1 >= replicas
    else:
        pytest.fail("a fixed host port cannot serve several replicas: publish a range")


def test_the_split_profile_adds_a_replica_for_the_writes(services):
    ingest, reads = services["dygserve-ingest"], services[SERVICE]
    assert ingest["profiles"] == ["split"] and "profiles" not in reads
    env, read_env = _env(ingest), _env(reads)
    assert env["DYGSERVE_REDIS_URL"] == read_env["DYGSERVE_REDIS_URL"]  # one store for both
    assert env["DYGSERVE_CHECKPOINT"] == read_env["DYGSERVE_CHECKPOINT"]
    assert int(_interpolate_default(env["DYGSERVE_STORE__SCRIPT_SLICE"])) > 0
    read_hosts = {h for _, h, _ in _ports(reads)}
    ((_, host, target),) = _ports(ingest)
    assert target == str(SERVICE_PORT) and host not in read_hosts
    prom = _load(DEPLOY / "prometheus.yml")
    (job,) = [j for j in prom["scrape_configs"] if j["job_name"] == "dygserve-ingest"]
    assert job["dns_sd_configs"][0]["names"] == ["dygserve-ingest"]


def test_published_ports_are_loopback_only(services):
    for name, svc in services.items():
        for ip, host, _ in _ports(svc):
            if host:
                assert ip == "127.0.0.1", f"{name} publishes {host} on all interfaces"


def test_named_volumes_are_declared(compose, services):
    declared = set((compose.get("volumes") or {}).keys())
    for name, svc in services.items():
        for src, _ in _mounts(svc):
            if src and _host_path(src) is None:
                assert src in declared, (name, src)
            elif src:
                assert _host_path(src).exists(), f"{name}: bind source {src} missing"


# --------------------------------------------------------------------------- Prometheus


def _mounted_host_file(svc: dict, target: str) -> Path:
    for src, tgt in _mounts(svc):
        if tgt == target:
            p = _host_path(src)
            assert p is not None and p.exists(), src
            return p
    raise AssertionError(f"nothing mounted at {target}")


def test_prometheus_scrapes_the_service(services):
    prom = services["prometheus"]
    cfg_args = [a for a in _as_list(prom.get("command") or []) if a.startswith("--config.file=")]
    cfg_path = cfg_args[0].split("=", 1)[1] if cfg_args else "/etc/prometheus/prometheus.yml"
    host_cfg = _mounted_host_file(prom, cfg_path)
    assert host_cfg == DEPLOY / "prometheus.yml"
    cfg = _load(host_cfg)
    jobs = [j for j in cfg["scrape_configs"] if j["job_name"] == SERVICE]
    assert len(jobs) == 1
    job = jobs[0]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets: list[tuple[str, int]] = []
    for sc in job.get("static_configs", []):
        for t in sc["targets"]:
            h, p = t.rsplit(":", 1)
            targets.append((h, int(p)))
    for sd in job.get("dns_sd_configs", []):
        assert sd.get("type", "SRV") == "A", "A records need an explicit port"
        targets += [(n, int(sd["port"])) for n in sd["names"]]
    assert targets, "no scrape target"
    assert all(t == (SERVICE, SERVICE_PORT) for t in targets), targets
    assert "prometheus" in _healthcheck_text(prom) or "9090" in _healthcheck_text(prom)


# --------------------------------------------------------------------------- Grafana


def test_grafana_provisioning_paths(services):
    g = services["grafana"]
    mounts = dict((tgt, src) for src, tgt in _mounts(g))
    ds_dir = _host_path(mounts["/etc/grafana/provisioning/datasources"])
    db_dir = _host_path(mounts["/etc/grafana/provisioning/dashboards"])
    assert ds_dir == DEPLOY / "grafana" / "provisioning" / "datasources"
    assert db_dir == DEPLOY / "grafana" / "provisioning" / "dashboards"
    ds = _load(ds_dir / "prometheus.yml")
    assert ds["apiVersion"] == 1
    (prom_ds,) = [d for d in ds["datasources"] if d["type"] == "prometheus"]
    assert prom_ds["url"] == "http://prometheus:9090" and prom_ds.get("uid")
    prov = _load(db_dir / "dashboards.yml")
    (provider,) = prov["providers"]
    assert provider["type"] == "file"
    container_path = provider["options"]["path"].rstrip("/")
    assert container_path in mounts, "the provider reads a folder that is not mounted"
    host_dir = _host_path(mounts[container_path])
    assert host_dir == DEPLOY / "grafana" / "dashboards"
    assert (host_dir / "dygserve.json").is_file()
    home = _env(g).get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    if home:
        assert home.startswith(container_path + "/")
        assert (host_dir / home[len(container_path) + 1 :]).is_file()


# --------------------------------------------------------------------------- docker-compose


def _compose_cmd() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker"):
        r = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
        if r.returncode == 0:
            return ["docker", "compose"]
    return None


def test_docker_compose_config_validates():
    cmd = _compose_cmd()
    if cmd is None:
        pytest.skip("docker-compose is not installed: only the parse-based checks ran")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "COMPOSE_"))}
    r = subprocess.run(
        [*cmd, "-f", str(COMPOSE), "config", "-q"],
        cwd=DEPLOY,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr + r.stdout


# --------------------------------------------------------------------------- cluster profile


def test_cluster_profile_runs_two_replicas_on_a_partitioned_three_master_cluster(services):
    cluster = {n: s for n, s in services.items() if "cluster" in (s.get("profiles") or [])}
    nodes = [n for n, s in cluster.items() if "--cluster-enabled" in _as_list(s.get("command", []))]
    assert len(nodes) == 3
    app = cluster["dygserve-cluster"]
    env = _env(app)
    assert env["DYGSERVE_REDIS_URL"].startswith("redis+cluster://")
    assert {h.split(":")[0] for h in env["DYGSERVE_REDIS_URL"][16:].split(",")} == set(nodes)
    assert int(env["DYGSERVE_STORE__PARTITIONS"]) > 1
    assert int(app["deploy"]["replicas"]) >= 2
    assert app["depends_on"]["redis-cluster-init"]["condition"] == "service_healthy"
    init = " ".join(_as_list(cluster["redis-cluster-init"]["command"]))
    assert "--cluster create" in init and all(n in init for n in nodes)
    # the default stack stays as it was: nothing of the profile starts without it
    assert not (services[SERVICE].get("profiles") or services["redis"].get("profiles"))
