"""Two server replicas on a local Ray Serve instance (loopback): both answer (their
``X-Replica-Id`` headers differ) and every answer is the model's own greedy text."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from powerinfer_backend import Llama

from tests.fixtures import ROOT

ray = pytest.importorskip("ray")
pytest.importorskip("ray.serve")
httpx = pytest.importorskip("httpx")

from tests.fixtures.server import free_port  # noqa: E402 - needs the packages checked above

PROMPTS = ["The capital of France is", "Once upon a time", "Water boils at", "def fibonacci(n):"]


@pytest.fixture(scope="module")
def ray_serve(model_path):
    from ray import serve

    from powerinfer_backend.server.ray import deployment

    port = free_port()
    # the replicas import this checkout (as the CLI tests' subprocesses do)
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    ray.init(
        num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR", runtime_env={"env_vars": env}
    )
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(deployment(model_path, num_replicas=2, num_cpus=1, n_ctx=512, n_threads=1), route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def test_two_replicas_answer_and_both_are_right(ray_serve, model_path):
    with Llama(model_path, n_ctx=512, n_threads=1, verbose=False) as llm:
        solo = {p: llm.create_completion(p, max_tokens=8, temperature=0)["choices"][0]["text"] for p in PROMPTS}

    def ask(p):
        r = httpx.post(
            ray_serve + "/v1/completions", json={"prompt": p, "max_tokens": 8, "temperature": 0}, timeout=120
        )
        return p, r.status_code, r.headers.get("x-replica-id"), r.json()["choices"][0]["text"]

    seen = {}
    deadline = time.monotonic() + 120
    with ThreadPoolExecutor(4) as ex:
        while len(seen) < 2:  # Ray's proxy spreads concurrent requests over the replicas
            assert time.monotonic() < deadline, f"only replicas {sorted(seen)} answered"
            for p, status, replica, text in ex.map(ask, PROMPTS):
                assert status == 200 and replica and text == solo[p], (p, replica, text, solo[p])
                seen.setdefault(replica, 0)
                seen[replica] += 1
    assert len(seen) == 2
    r = httpx.get(ray_serve + "/health", timeout=30)
    assert r.status_code == 200 and r.headers["x-replica-id"] in seen


def test_kuberay_manifest_builds_the_application():
    """deploy/kuberay/rayservice.yaml: its serveConfigV2 is a valid Serve config whose
    import path and args build the deployment (no Ray started)."""
    import yaml
    from ray.serve.schema import ServeDeploySchema

    from powerinfer_backend.server import ray as pray

    doc = yaml.safe_load((ROOT / "deploy" / "kuberay" / "rayservice.yaml").read_text())
    assert doc["kind"] == "RayService"
    config = ServeDeploySchema.model_validate(yaml.safe_load(doc["spec"]["serveConfigV2"]))
    (app,) = config.applications
    module, attr = app.import_path.split(":")
    assert module == pray.__name__
    bound = getattr(pray, attr)(app.args)._bound_deployment
    assert bound.num_replicas == app.args["num_replicas"] == 2
    assert bound.ray_actor_options["num_cpus"] == app.args["num_cpus"]
    with pytest.raises(ValueError, match="num_replicas"):
        pray.deployment(num_replicas=0)
