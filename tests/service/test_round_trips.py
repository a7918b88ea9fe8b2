"""The hot paths are batched: store round trips per request do not grow with the batch."""

from __future__ import annotations

import redis

from service.engine import Engine, ModelRuntime
from state_store.redis_store import RedisStore
from training.data import read_edge_stream


class CountingConnection(redis.Connection):
    """A real connection that counts the packets it sends (one per round trip)."""

    sent = 0

    def send_packed_command(self, command, check_health=True):
        CountingConnection.sent += 1
        return super().send_packed_command(command, check_health)


def round_trips(fn) -> int:
    before = CountingConnection.sent
    fn()
    return CountingConnection.sent - before


def test_ingest_and_score_round_trips_do_not_grow(redis_server, models_dir, data_dir):
    redis_server.flush()
    stream = read_edge_stream(data_dir / "uci", limit=3000)
    store = RedisStore(url=redis_server.url, connection_class=CountingConnection)
    engine = Engine(ModelRuntime.load(models_dir / "a"), store)

    def batch(lo, hi):
        return [
            {
                "src": stream.src[i],
                "dst": stream.dst[i],
                "t": float(stream.t[i]),
                "features": [0.0, 0.0],
            }
            for i in range(lo, hi)
        ]

    engine.ingest(batch(0, 5))  # warm-up: connection handshake and script loading
    engine.score_pairs([(stream.src[0], stream.dst[0], 1.0)])
    small_ingest = round_trips(lambda: engine.ingest(batch(5, 15)))
    big_ingest = round_trips(lambda: engine.ingest(batch(15, 1010)))
    again_ingest = round_trips(lambda: engine.ingest(batch(1010, 2010)))
    assert small_ingest == big_ingest == again_ingest, (small_ingest, big_ingest, again_ingest)

    nodes = list(dict.fromkeys(list(stream.src[:2010]) + list(stream.dst[:2010])))
    t = float(stream.t[2010])
    pairs = [(nodes[i % len(nodes)], nodes[(7 * i + 3) % len(nodes)], t) for i in range(1000)]
    small_score = round_trips(lambda: engine.score_pairs(pairs[:10]))
    big_score = round_trips(lambda: engine.score_pairs(pairs))
    assert small_score == big_score, (small_score, big_score)
    assert big_ingest <= 8 and big_score <= 3
    store.close()
