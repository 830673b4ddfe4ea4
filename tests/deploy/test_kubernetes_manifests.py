"""deploy/kubernetes: the manifests kvtier ships for clusters it cannot run here. Every object validates against the
Kubernetes API's schemas (kubernetes-validate's, strict: a misspelt or unknown field fails) for 1.30 and 1.37; the
adapter parameters each LMCache container gives kvtier are accepted by kvtier's own configuration model and point
into the pod's volumes; vLLM connects to LMCache as run-stack.sh connects it; every port a Service names is a
container's; the Prometheus configuration passes promtool with kvtier's recording rules beside it (but for its
Kubernetes service discovery, which Debian's Prometheus is built without)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from deploy import SCRIPTS
from deploy.instance import Instance
from kvconnector.backend_config import BackendConfig

HERE = SCRIPTS / "kubernetes"
MANIFESTS = sorted(p for p in HERE.glob("*.yaml"))
VERSIONS = ["1.30.0", "1.37.0"]


def objects(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def pods(path: Path) -> list[dict]:
    return [o["spec"]["template"]["spec"] for o in objects(path) if o["kind"] == "Deployment"]


def container(pod: dict, name: str) -> dict:
    (c,) = [c for c in pod["containers"] if c["name"] == name]
    return c


def arg_after(c: dict, flag: str) -> str:
    args = c["args"]
    return args[args.index(flag) + 1]


def flag_value(c: dict, flag: str) -> str:
    (v,) = [a.split("=", 1)[1] for a in c["args"] if a.startswith(flag + "=")]
    return v


def test_there_are_manifests_for_local_nvme_and_a_shared_volume():
    assert {p.name for p in MANIFESTS} >= {"kvtier-local-nvme.yaml", "kvtier-shared-pvc.yaml"}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_object_validates_against_the_api_schemas(path, version):
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (the test extra)")
    for obj in objects(path):
        kv.validate(obj, version, strict=True)  # raises ValidationError with the field's path
    # and a broken one does not: the validator is really looking
    bad = objects(path)[0]
    bad["spec"]["replicaz"] = 1
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, version, strict=True)


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_kvtier_parameters_are_accepted_by_kvtier_and_live_in_the_pods_volumes(path):
    for pod in pods(path):
        lm = container(pod, "lmcache")
        spec = json.loads(arg_after(lm, "--l2-adapter"))
        assert (spec["module_path"], spec["class_name"]) == ("kvconnector.lmcache.l2_adapter", "KvtierL2Adapter")
        params = spec["adapter_params"]
        cfg = BackendConfig(**params)  # kvtier's own model: a wrong key or value fails here
        assert spec["shared"] == bool(cfg.shared_dir)
        mounts = [m["mountPath"] for m in lm["volumeMounts"]]
        for d in (cfg.disk_dir, cfg.shared_dir, str(Path(cfg.snapshot_path).parent)):
            if d:
                assert any(d == m or d.startswith(m + "/") for m in mounts), (d, mounts)
        ports = {p["name"]: p["containerPort"] for p in lm["ports"]}
        assert ports["kvtier-metrics"] == cfg.metrics_port
        assert ports["lmcache-http"] == int(flag_value(lm, "--http-port"))
        assert ports["lmcache-metrics"] == int(flag_value(lm, "--prometheus-port"))


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_vllm_connects_to_lmcache_as_run_stack_does(path):
    for pod in pods(path):
        lm, vllm = container(pod, "lmcache"), container(pod, "vllm")
        inst = Instance(0, "127.0.0.1", 8000, int(flag_value(lm, "--port")), 8090, 9200, "/kv")
        want = json.loads(inst.kv_transfer_config(SimpleNamespace(mode="mp")))
        assert json.loads(arg_after(vllm, "--kv-transfer-config")) == want
        assert flag_value(lm, "--host") == "127.0.0.1"  # LMCache's ZMQ port stays on the pod's loopback


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_service_port_is_a_containers(path):
    objs = objects(path)
    exposed = {p["name"] for pod in pods(path) for c in pod["containers"] for p in c.get("ports", [])}
    services = [o for o in objs if o["kind"] == "Service"]
    assert services
    for svc in services:
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= exposed
        labels = [o["spec"]["template"]["metadata"]["labels"] for o in objs if o["kind"] == "Deployment"]
        assert any(svc["spec"]["selector"].items() <= lab.items() for lab in labels)
        assert svc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "kvtier"  # what Prometheus keeps


def test_prometheus_config_passes_promtool_with_the_rules(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus; deploy/install-system-deps.sh)")
    # Debian's Prometheus is built without Kubernetes service discovery, so its promtool refuses that one key: it is
    # swapped for a static target here, and everything else (relabelling, rules, their file) is promtool's to judge.
    conf = yaml.safe_load((HERE / "prometheus.yml").read_text())
    for job in conf["scrape_configs"]:
        assert job.pop("kubernetes_sd_configs") == [{"role": "endpoints"}]
        job["static_configs"] = [{"targets": ["127.0.0.1:9"]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(conf))
    shutil.copy(SCRIPTS / "prometheus" / "kvtier-rules.yml", tmp_path / "kvtier-rules.yml")
    r = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout + r.stderr and "rule" in (r.stdout + r.stderr).lower()
    jobs = {j["job_name"] for j in yaml.safe_load((HERE / "prometheus.yml").read_text())["scrape_configs"]}
    assert jobs == {"vllm", "lmcache", "kvtier"}  # the jobs deploy/prometheus_config.py gives a run-stack.sh stack
