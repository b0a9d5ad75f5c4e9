"""The Kubernetes, Knative, KServe and Cloud Run manifests and the SageMaker serverless template, validated offline
with schema validators from PyPI: kubernetes-validate's vendored Kubernetes schemas (strict: no unknown fields),
a Knative Service schema and a KServe InferenceService schema built on those same PodSpec definitions (KServe's
CRD is not on PyPI: its predictor's fields as KServe documents them), and cfn-lint. Then the wiring between the
manifests and the handler: probes on real routes, concurrency matched to the pool, grace covering the drain."""

from __future__ import annotations

import copy
import json
from importlib.resources import files
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from cfnlint.api import lint_file
from referencing import Registry, Resource

from handler.core.cpu import plan_threads
from handler.http_host.settings import DEFAULT_DRAIN_S, HostSettings
from handler.runtime.workers import WorkerPool, sizing_from_environ
from tests.deploy.sam import ROOT

DEPLOY = ROOT / "infra" / "deploy"
K8S = DEPLOY / "k8s" / "warmstart.yaml"
KNATIVE = DEPLOY / "knative.yaml"
KNATIVE_GENERATE = DEPLOY / "knative-generate.yaml"
CLOUD_RUN = DEPLOY / "cloudrun.yaml"
KSERVE = DEPLOY / "kserve.yaml"
SAGEMAKER = DEPLOY / "sagemaker-serverless.yaml"
K8S_VERSION = "1.33"  # the oldest minor still supported upstream; its schema must accept the manifests
HTTP_ROUTES = {"/ping", "/healthz", "/health", "/info", "/v2/health/live", "/v2/health/ready"}
CLOUD_RUN_KILL_S = 10


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def k8s_definitions() -> dict[str, Any]:
    """kubernetes-validate's vendored schema definitions (strict: additionalProperties false) for K8S_VERSION."""
    root = files("kubernetes_validate") / "kubernetes-json-schema"
    (folder,) = [p for p in root.iterdir() if p.name == f"v{K8S_VERSION}.0-local-strict"]
    data: dict[str, Any] = json.loads((folder / "_definitions.json").read_text())
    return data


DEFS = "/api/_definitions.json#/$defs/"  # how the vendored schemas refer to their shared definitions


def knative_validator() -> jsonschema.Draft202012Validator:
    """serving.knative.dev/v1 Service: Knative's envelope (metadata, spec.template) around Kubernetes' own strict
    PodSpec definitions, plus the fields a Knative revision adds to a PodSpec (containerConcurrency, timeouts).
    Knative's CRD itself leaves the spec open (its webhook validates), so this is the stricter check."""
    definitions = copy.deepcopy(k8s_definitions())
    pod = definitions["$defs"]["io.k8s.api.core.v1.PodSpec"]
    pod["properties"] |= {
        "containerConcurrency": {"type": "integer", "minimum": 0, "maximum": 1000},
        "timeoutSeconds": {"type": "integer", "minimum": 0, "maximum": 3600},
        "responseStartTimeoutSeconds": {"type": "integer", "minimum": 0},
        "idleTimeoutSeconds": {"type": "integer", "minimum": 0},
    }
    pod["required"] = ["containers"]
    # Knative fills these in itself: a container's name, and a probe's port (the container's).
    for name, field in (("io.k8s.api.core.v1.Container", "name"), ("io.k8s.api.core.v1.HTTPGetAction", "port")):
        definition = definitions["$defs"][name]
        definition["required"] = [r for r in definition.get("required", []) if r != field]
    meta = {"$ref": DEFS + "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://kubernetes.io/api/knative-service-serving-v1.json",
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "serving.knative.dev/v1"},
            "kind": {"const": "Service"},
            "metadata": meta,
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "required": ["template"],
                "properties": {
                    "template": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {"metadata": meta, "spec": {"$ref": DEFS + "io.k8s.api.core.v1.PodSpec"}},
                    },
                    "traffic": {"type": "array"},
                },
            },
        },
    }
    registry: Registry[Any] = Registry().with_resources(
        [(schema["$id"], Resource.from_contents(schema)), (definitions["$id"], Resource.from_contents(definitions))]
    )
    return jsonschema.Draft202012Validator(schema, registry=registry)


def kserve_validator() -> jsonschema.Draft202012Validator:
    """serving.kserve.io/v1beta1 InferenceService with a custom-container predictor: the predictor is a strict
    Kubernetes PodSpec (inlined, as KServe's PredictorSpec inlines it) plus KServe's ComponentExtensionSpec
    fields (minReplicas, maxReplicas, scaleTarget, scaleMetric, containerConcurrency, timeout, ...), as
    KServe's API reference lists them. No offline copy of KServe's CRD exists on PyPI, hence this structure."""
    definitions = copy.deepcopy(k8s_definitions())
    pod = definitions["$defs"]["io.k8s.api.core.v1.PodSpec"]
    pod["properties"] |= {
        "minReplicas": {"type": "integer", "minimum": 0},
        "maxReplicas": {"type": "integer", "minimum": 0},
        "scaleTarget": {"type": "integer", "minimum": 0},
        "scaleMetric": {"enum": ["concurrency", "rps", "cpu", "memory"]},
        "containerConcurrency": {"type": "integer", "minimum": 0},
        "timeout": {"type": "integer", "minimum": 0},
        "canaryTrafficPercent": {"type": "integer", "minimum": 0, "maximum": 100},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        "logger": {"type": "object"},
        "batcher": {"type": "object"},
    }
    pod["required"] = ["containers"]
    definition = definitions["$defs"]["io.k8s.api.core.v1.HTTPGetAction"]  # a probe's port: the container's
    definition["required"] = [r for r in definition.get("required", []) if r != "port"]
    meta = {"$ref": DEFS + "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://kubernetes.io/api/kserve-inferenceservice-v1beta1.json",
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "serving.kserve.io/v1beta1"},
            "kind": {"const": "InferenceService"},
            "metadata": meta,
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "required": ["predictor"],
                "properties": {"predictor": {"$ref": DEFS + "io.k8s.api.core.v1.PodSpec"}},
            },
        },
    }
    registry: Registry[Any] = Registry().with_resources(
        [(schema["$id"], Resource.from_contents(schema)), (definitions["$id"], Resource.from_contents(definitions))]
    )
    return jsonschema.Draft202012Validator(schema, registry=registry)


def kserve_errors(doc: dict[str, Any]) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in kserve_validator().iter_errors(doc)]


def knative_errors(doc: dict[str, Any]) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in knative_validator().iter_errors(doc)]


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


# -- schemas -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("doc", documents(K8S), ids=lambda d: d["kind"])
def test_kubernetes_manifests_valid_strict(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_kubernetes_validator_does_reject() -> None:
    """The check can fail: an unknown field and a wrong type are refused."""
    deployment = copy.deepcopy(documents(K8S)[0])
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy_"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)
    deployment = copy.deepcopy(documents(K8S)[0])
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


@pytest.mark.parametrize("path", [KNATIVE, KNATIVE_GENERATE, CLOUD_RUN], ids=lambda p: p.name)
def test_knative_services_valid(path: Path) -> None:
    (doc,) = documents(path)
    assert knative_errors(doc) == []


def test_knative_schema_does_reject() -> None:
    (doc,) = documents(KNATIVE)
    bad = copy.deepcopy(doc)
    bad["spec"]["template"]["spec"]["containerConcurrency"] = "4"
    bad["spec"]["template"]["spec"]["containers"][0]["startupProbe"]["httpGet"]["paht"] = "/ping"
    errors = knative_errors(bad)
    assert any("containerConcurrency" in e for e in errors) and any("paht" in e for e in errors)


def test_kserve_inference_service_valid() -> None:
    (doc,) = documents(KSERVE)
    assert kserve_errors(doc) == []
    annotations, predictor = doc["metadata"]["annotations"], doc["spec"]["predictor"]
    assert annotations["serving.kserve.io/deploymentMode"] == "Serverless"  # Knative: it scales to zero
    assert predictor["minReplicas"] == 0
    # KServe's name for a custom predictor's container; its port is the HTTP host's.
    (container,) = predictor["containers"]
    assert container["name"] == "kserve-container" and container["ports"][0]["containerPort"] == 8080
    # Sized as the Knative Service (docs/deploy.md): the same resources, concurrency and pool.
    (knative,) = documents(KNATIVE)
    (kn,) = knative["spec"]["template"]["spec"]["containers"]
    assert container["resources"] == kn["resources"] and env_of(container) == env_of(kn)
    assert predictor["containerConcurrency"] == knative["spec"]["template"]["spec"]["containerConcurrency"]


def test_kserve_schema_does_reject() -> None:
    (doc,) = documents(KSERVE)
    bad = copy.deepcopy(doc)
    bad["spec"]["predictor"]["minReplica"] = 0
    bad["spec"]["predictor"]["scaleMetric"] = "latency"
    bad["spec"]["predictor"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/ping"
    errors = kserve_errors(bad)
    assert any("minReplica" in e for e in errors) and any("latency" in e for e in errors)
    assert any("paht" in e for e in errors)


def test_sagemaker_template_cfn_lint_clean() -> None:
    assert [str(m) for m in lint_file(SAGEMAKER)] == []


# -- wiring: the manifests and the handler agree ------------------------------------------------------------


def containers() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(file, pod spec, container) for every manifest that runs the HTTP host."""
    out = []
    for path in (K8S, KNATIVE, CLOUD_RUN, KSERVE):
        for doc in documents(path):
            if doc["kind"] in ("Deployment", "Service") and "template" in doc["spec"]:
                spec = doc["spec"]["template"]["spec"]
                out += [(path.name, spec, c) for c in spec["containers"]]
            elif doc["kind"] == "InferenceService":  # the predictor is the pod spec (a Knative revision's)
                spec = doc["spec"]["predictor"]
                out += [(path.name, spec, c) for c in spec["containers"]]
    return out


@pytest.mark.parametrize(("name", "spec", "container"), containers(), ids=lambda v: v if isinstance(v, str) else "")
def test_probes_hit_real_routes_and_pool_matches_concurrency(
    name: str, spec: dict[str, Any], container: dict[str, Any]
) -> None:
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        if probe in container:
            assert container[probe]["httpGet"]["path"] in HTTP_ROUTES, (name, probe)
    assert container["startupProbe"]["httpGet"]["path"] == "/ping"  # 200 only once init is done
    env = env_of(container)
    settings = HostSettings.from_environ(env)  # the settings parse as the handler would parse them
    cpus = int(container["resources"]["limits"]["cpu"])
    sizing = sizing_from_environ(env, cpus)  # as the host sizes its pool from the file's env and quota
    assert cpus >= sizing.max_workers  # one worker per vCPU at most: each run's threads get a CPU
    assert plan_threads(cpus, sizing.max_workers).threads * sizing.max_workers <= cpus
    if "containerConcurrency" in spec:
        # What the platform sends at once is what the pool absorbs: a closed loop of that many clients never
        # finds the queue full (no 503), and none waits behind more than one batch per worker.
        concurrency = spec["containerConcurrency"]
        assert concurrency <= sizing.max_queue
        assert concurrency <= sizing.max_workers * sizing.max_batch
    drain = settings.drain_s
    if name == CLOUD_RUN.name:
        assert drain < CLOUD_RUN_KILL_S
    elif "terminationGracePeriodSeconds" in spec:
        pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
        assert pre_stop + drain + 1 <= spec["terminationGracePeriodSeconds"]
    else:  # Knative gives a pod timeoutSeconds to terminate (KServe's predictor: `timeout`)
        assert drain + 1 <= spec.get("timeoutSeconds", spec.get("timeout"))


def test_default_drain_fits_every_platform() -> None:
    assert DEFAULT_DRAIN_S + 1 <= CLOUD_RUN_KILL_S


def test_sagemaker_serverless_sets_its_payload_limit() -> None:
    text = SAGEMAKER.read_text()
    assert "WARMSTART_HOST: sagemaker-serverless" in text and "ServerlessConfig:" in text


@pytest.mark.parametrize(
    ("name", "spec", "container"),
    [c for c in containers() if "containerConcurrency" in c[1]],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_closed_loop_at_the_files_concurrency_gets_no_503(
    name: str, spec: dict[str, Any], container: dict[str, Any]
) -> None:
    """The pool as the file's env sizes it, under exactly containerConcurrency closed-loop clients (each sends
    its next request when its last is answered) with a model run of a few ms: every request is answered."""
    import threading
    import time

    env = env_of(container)
    cpus = int(container["resources"]["limits"]["cpu"])
    pool = WorkerPool(sizing_from_environ(env, cpus), cpus)
    errors: list[BaseException] = []

    def run_many(items: Any, batch: Any) -> None:
        time.sleep(0.002 + 0.0002 * len(items))  # a batch costs a bit more than one request, much less than n
        for k, item in enumerate(items):
            batch.settle(k, item)

    def client(i: int) -> None:
        for k in range(20):
            try:
                assert pool.submit_batch(run_many, (i, k)).result(30) == (i, k)
            except BaseException as e:
                errors.append(e)
                return

    clients = [threading.Thread(target=client, args=(i,)) for i in range(spec["containerConcurrency"])]
    for t in clients:
        t.start()
    for t in clients:
        t.join(60)
    stats = pool.stats()
    pool.shutdown()
    assert not errors, errors[:3]
    assert stats["rejected"] == 0 and stats["completed"] == 20 * spec["containerConcurrency"]
    assert stats["largest_batch"] > 1  # the load was absorbed by batching, not by luck


def test_the_generate_service_sends_what_its_rows_and_queue_absorb() -> None:
    """containerConcurrency = WARMSTART_GENAI_BATCH + WARMSTART_GENAI_QUEUE: every stream the platform sends gets
    a row or a place in the engine's queue (no 503); the settings parse as the handler parses them."""
    from handler.backends.genai_spec import GenaiSettings

    (doc,) = documents(KNATIVE_GENERATE)
    spec = doc["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    own = GenaiSettings.from_environ(env_of(container))
    assert own.batch > 1 and spec["containerConcurrency"] == own.batch + own.queue
    assert container["startupProbe"]["httpGet"]["path"] == "/ping"
    assert HostSettings.from_environ(env_of(container)).drain_s + 1 <= spec["timeoutSeconds"]
