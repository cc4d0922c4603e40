"""deploy/k8s validated offline: every resource against the Kubernetes schemas
(kubernetes-validate, strict: an unknown or misspelt field fails), the KServe
InferenceService against the fields of its CRD (serving.kserve.io/v1beta1) with its pod
parts against the Kubernetes schemas, and the references between the resources.
What only a cluster shows (the image pulls, Triton loads from S3, the HPA gets its metric)
is listed in docs/deploy.md."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
# The Kubernetes release whose schemas the manifests must pass (kubernetes-validate bundles it).
K8S_VERSION = "1.34.0"

# The InferenceService fields this repository uses, as KServe's v1beta1 CRD defines them
# (config/crd/full/serving.kserve.io_inferenceservices.yaml): the predictor is a
# ComponentExtensionSpec plus an inline PodSpec plus `model`; the model is a ModelSpec:
# the fields below plus an inline Container.
KSERVE_PREDICTOR_EXTENSION = {"minReplicas", "maxReplicas", "scaleTarget", "scaleMetric", "scaleMetricType",
                              "containerConcurrency", "timeout", "canaryTrafficPercent", "logger", "batcher", "labels",
                              "annotations", "deploymentStrategy", "model", "workerSpec", "autoScaling"}
KSERVE_MODEL_FIELDS = {"modelFormat", "runtime", "runtimeVersion", "protocolVersion", "storageUri", "storage"}
KSERVE_SCALE_METRICS = {"cpu", "memory", "concurrency", "rps"}
KSERVE_PROTOCOLS = {"v1", "v2", "grpc-v1", "grpc-v2"}


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _resources(folder: Path) -> list[tuple[Path, dict]]:
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    return [(folder / name, doc) for name in kustomization["resources"] for doc in _docs(folder / name)]


def _by_kind(folder: Path, kind: str) -> dict:
    (doc,) = [d for _, d in _resources(folder) if d["kind"] == kind]
    return doc


def _dockerfile_tag() -> str:
    return re.search(r"^ARG TRITON_TAG=(\S+)$", (ROOT / "Dockerfile").read_text(), re.M).group(1)


@pytest.mark.parametrize("folder", ["base", "kserve"])
def test_kustomization_lists_every_manifest(folder):
    listed = {p.name for p, _ in _resources(K8S / folder)}
    present = {p.name for p in (K8S / folder).glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


def _k8s_resources() -> list[tuple[str, dict]]:
    found = []
    for folder in ("base", "kserve"):
        for path, doc in _resources(K8S / folder):
            if doc["apiVersion"].startswith("serving.kserve.io/"):
                continue  # a custom resource: the KServe tests below
            found.append((f"{folder}/{path.name}:{doc['kind']}", doc))
    return found


@pytest.mark.parametrize("name, doc", _k8s_resources(), ids=[n for n, _ in _k8s_resources()])
def test_manifest_passes_the_kubernetes_schema(name, doc):
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_schema_check_catches_a_misspelt_field():
    """The validation above can fail: a typo in the container's probe is refused."""
    doc = copy.deepcopy(_by_kind(K8S / "base", "Deployment"))
    container = doc["spec"]["template"]["spec"]["containers"][0]
    container["readinessProbe"]["httpGett"] = container["readinessProbe"].pop("httpGet")
    with pytest.raises(kubernetes_validate.ValidationError, match="httpGett"):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_deployment_has_what_triton_needs_on_a_cluster():
    deployment = _by_kind(K8S / "base", "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    # /dev/shm: a memory-backed emptyDir, sized for the python backend.
    volumes = {v["name"]: v for v in pod["volumes"]}
    shm = [m["name"] for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    assert shm and volumes[shm[0]]["emptyDir"]["medium"] == "Memory"
    assert volumes[shm[0]]["emptyDir"]["sizeLimit"] in ("1Gi", "2Gi", "4Gi")
    # Readiness on bls-serve's status port (it follows the --ready-for flows; Triton's strict
    # readiness never recovers from one failed load); liveness and startup on Triton's.
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "status"}
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/live"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002, "status": 8003}
    # A GPU per pod; non-root, no privilege escalation.
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    # The model repository on S3, the credentials and region from the Secret.
    env = {e["name"]: e for e in container["env"]}
    assert env["MODEL_REPOSITORY"]["value"].startswith("s3://")
    secret = _by_kind(K8S / "base", "Secret")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        ref = env[name]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"]
    # The repository from S3; a tritonserver that dies ends the container, for Kubernetes to restart.
    assert (container["args"]
            == ["--model-repository", "$(MODEL_REPOSITORY)", "--no-restart", "--ready-for", "classify_bls"])


def test_service_hpa_and_pdb_point_at_the_deployment():
    base = K8S / "base"
    deployment = _by_kind(base, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert _by_kind(base, "Service")["spec"]["selector"].items() <= labels.items()
    assert _by_kind(base, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= labels.items()
    hpa = _by_kind(base, "HorizontalPodAutoscaler")
    assert (hpa["spec"]["scaleTargetRef"]
            == {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment["metadata"]["name"]})
    # A drain may evict a pod while the others serve.
    assert hpa["spec"]["minReplicas"] > _by_kind(base, "PodDisruptionBudget")["spec"]["minAvailable"]


def test_the_hpa_metric_is_the_one_the_adapter_serves():
    hpa = _by_kind(K8S / "base", "HorizontalPodAutoscaler")
    (pods,) = [m["pods"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    rules = yaml.safe_load((K8S / "monitoring" / "prometheus-adapter-values.yaml").read_text())["rules"]["custom"]
    (rule,) = [r for r in rules if r["name"]["as"] == pods["metric"]["name"]]
    # Triton's own counters (present in 2.51 and in the NGC release alike).
    assert ("nv_inference_queue_duration_us" in rule["metricsQuery"]
            and "nv_inference_request_success" in rule["metricsQuery"])


def _inference_service() -> dict:
    return _by_kind(K8S / "kserve", "InferenceService")


def _pod_of(predictor: dict) -> dict:
    """The Pod the predictor describes: its PodSpec fields, the model as its one container."""
    model = predictor["model"]
    container = {k: v for k, v in model.items() if k not in KSERVE_MODEL_FIELDS}
    container.setdefault("name", "kserve-container")
    container.setdefault("image", "the-runtime-image")
    spec = {k: v for k, v in predictor.items() if k not in KSERVE_PREDICTOR_EXTENSION}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "predictor"},
            "spec": {**spec, "containers": [container]}}


def test_inference_service_uses_only_fields_of_the_kserve_crd():
    isvc = _inference_service()
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1"
    assert set(isvc) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(isvc["spec"]) <= {"predictor", "transformer", "explainer"}
    predictor = isvc["spec"]["predictor"]
    # Its pod parts (PodSpec fields, the model as a container) pass the Kubernetes schemas:
    # an unknown field there is neither KServe's nor Kubernetes'.
    kubernetes_validate.validate(_pod_of(predictor), K8S_VERSION, strict=True)
    assert predictor["scaleMetric"] in KSERVE_SCALE_METRICS
    assert isinstance(predictor["scaleTarget"], int) and 1 <= predictor["minReplicas"] <= predictor["maxReplicas"]
    model = predictor["model"]
    assert set(model["modelFormat"]) <= {"name", "version"} and model["modelFormat"]["name"] == "triton"
    assert model["protocolVersion"] in KSERVE_PROTOCOLS
    assert model["storageUri"].startswith("s3://")


def test_the_kserve_check_catches_a_field_kserve_does_not_have():
    isvc = copy.deepcopy(_inference_service())
    isvc["spec"]["predictor"]["model"]["storageURI"] = isvc["spec"]["predictor"]["model"].pop("storageUri")
    with pytest.raises(kubernetes_validate.ValidationError, match="storageURI"):
        kubernetes_validate.validate(_pod_of(isvc["spec"]["predictor"]), K8S_VERSION, strict=True)


def test_inference_service_runs_the_stock_runtime_of_the_dockerfiles_release():
    isvc = _inference_service()
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == "kserve-tritonserver"
    assert model["runtimeVersion"] == f"{_dockerfile_tag()}-py3"
    assert "image" not in model  # the stock image: no custom one
    volumes = {v["name"]: v for v in isvc["spec"]["predictor"]["volumes"]}
    (shm,) = [m["name"] for m in model["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    assert volumes[shm]["emptyDir"]["medium"] == "Memory"
    assert model["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert isvc["spec"]["predictor"]["securityContext"]["runAsNonRoot"] is True
    account = [d for _, d in _resources(K8S / "kserve") if d["kind"] == "ServiceAccount"][0]
    assert account["metadata"]["name"] == isvc["spec"]["predictor"]["serviceAccountName"]
    secret = _by_kind(K8S / "kserve", "Secret")
    assert {"name": secret["metadata"]["name"]} in account["secrets"]
    assert "serving.kserve.io/s3-region" in secret["metadata"]["annotations"]
