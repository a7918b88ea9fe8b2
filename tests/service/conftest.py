from __future__ import annotations

import pytest
import torch

from model.checkpoint import save_checkpoint
from model.config import ModelConfig
from model.link_model import DygMambaLinkModel
from tests.support.redis_server import redis_available, start_redis
from tests.support.service_process import start_service


def make_checkpoint(path, seed: int = 0, edge_feature_dim: int = 2, **config) -> str:
    torch.manual_seed(seed)
    return save_checkpoint(
        path,
        DygMambaLinkModel(
            ModelConfig(edge_feature_dim=edge_feature_dim, d_model=16, d_state=8, **config)
        ),
    )


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    make_checkpoint(root / "a", seed=0)
    make_checkpoint(root / "b", seed=1)
    return root


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    if not redis_available():
        pytest.skip("redis-server is not installed (CI installs it)")
    server = start_redis(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def service(models_dir, tmp_path_factory):
    """The real service on the embedded store, with an API key."""
    svc = start_service(
        tmp_path_factory.mktemp("svc"),
        {
            "DYGSERVE_CHECKPOINT": str(models_dir / "a"),
            "DYGSERVE_API_KEY": "s3cret",
            "DYGSERVE_MAX_BATCH_EVENTS": "100",
            "DYGSERVE_MAX_BODY_BYTES": "65536",
        },
    )
    yield svc
    svc.stop()


@pytest.fixture()
def client(service):
    with service.client(headers={"X-API-Key": "s3cret"}) as c:
        yield c
