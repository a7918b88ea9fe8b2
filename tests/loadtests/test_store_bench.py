"""The store benchmark runs and reports (tiny sizes: a smoke test, not a benchmark)."""

from __future__ import annotations

import pytest

from loadtests.store_bench import main, parse_redis_benchmark, run_store_bench
from model.config import ModelConfig


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_store_bench_smoke(store_url: str | None) -> None:
    r = run_store_bench(
        store_url,
        n_states=20,
        rounds=2,
        config=ModelConfig(d_model=8, d_state=4),
        redis_benchmark=False,
    )
    assert r["n_states"] == 20 and r["blob_bytes"] > 64
    for name, fig in r["results"].items():
        assert fig["ms_per_batch"] > 0, name
    assert any(k.startswith("raw MGET") for k in r["results"]) == (store_url is not None)
    assert "| batch read (read_states: MGET) |" in r["markdown"]
    if store_url:  # the bench cleans up after itself
        from state_store.factory import make_store

        s = make_store(store_url)
        assert s.client.dbsize() == 0
        s.close()


def test_bench_main_prints(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--n-states", "10", "--rounds", "1"]) == 0
    assert "states/s" in capsys.readouterr().out


def test_parse_redis_benchmark_output() -> None:
    text = "SET: rps=0.0 (overall: nan) avg_msec=nan\rSET: 126582.28 requests per second, p50=3.463 msec\nGET: 204081.62 requests per second, p50=2.007 msec\n"
    assert parse_redis_benchmark(text) == {"SET": 126582.28, "GET": 204081.62}
