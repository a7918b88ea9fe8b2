"""The service on the onnxruntime backend gives the torch backend's scores."""

from __future__ import annotations

from tests.support.service_process import start_service


def test_onnx_backend_serves_the_same_numbers(tmp_path, models_dir):
    body = {
        "events": [
            {"src": f"n{i % 7}", "dst": f"m{i % 5}", "t": float(i), "features": [0.1 * i, 1.0]}
            for i in range(40)
        ]
    }
    pairs = {
        "pairs": [{"src": f"n{i}", "dst": f"m{j}", "t": 50.0} for i in range(7) for j in range(5)]
        + [{"src": "new", "dst": "m1", "t": 50.0}]
    }
    results = {}
    for backend in ("torch", "onnx"):
        svc = start_service(
            tmp_path / backend if (tmp_path / backend).mkdir() is None else tmp_path,
            {"DYGSERVE_CHECKPOINT": str(models_dir / "a"), "DYGSERVE_BACKEND": backend},
            timeout=120,
        )
        try:
            with svc.client() as c:
                assert c.post("/v1/events", json=body).json()["accepted"] == 40
                info = c.get("/v1/model").json()
                assert info["backend"] == backend
                if backend == "onnx":  # the providers the scoring session really got
                    assert "CPUExecutionProvider" in info["kernels"]["scoring_providers"]
                results[backend] = [
                    s["logit"] for s in c.post("/v1/score", json=pairs).json()["scores"]
                ]
        finally:
            svc.stop()
    diff = max(abs(a - b) for a, b in zip(results["torch"], results["onnx"], strict=True))
    assert diff <= 1e-5, diff
