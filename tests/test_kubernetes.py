"""deploy/kubernetes as an operator applies it: ``kubectl kustomize`` (Debian's kubectl)
renders an agent DaemonSet and a coordinator Deployment with its Service and database;
every resource passes Kubernetes 1.30's schemas strictly (``kubernetes-validate``) and
the checkov scanner (in its own venv, ``make test`` installs it: .venv-scan) with no
failing check, and only the skips listed here, each with its reason in the manifest.

The manifests hold to the programs: the ConfigMaps' configs load with the agent's and
the coordinator's own loaders, every path they name lies in a volume the container
mounts, ports and probes are the servers' own, and the security context is the systemd
units' hardening. No cluster runs here, so the last test runs both pods' commands as
kubelet would (the image's ENTRYPOINT and the manifest's args and env, every mount a
folder of the test's, the Secrets' keys files of it, the coordinator on a real
PostgreSQL): the probes answer on the ports and schemes the manifests give, and the
agent reports under its node's name.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import ssl
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml

from agent.config import parse_agent_config
from agent.coordinator.config import load_coordinator_config
from tests.containers import (ROOT, Running, as_here, exec_form, image_env, process_env,
                              status)
from tests.helpers import add_mlp, issue_cert, make_ca, wait_for

KUBE = ROOT / "deploy" / "kubernetes"
KUBECTL = shutil.which("kubectl")
CHECKOV = next((p for p in (ROOT / ".venv-scan" / "bin" / "checkov",
                            Path(shutil.which("checkov") or "/nonexistent")) if p.exists()),
               None)
needs_kubectl = pytest.mark.skipif(
    KUBECTL is None, reason="no kubectl (Debian: apt-get install kubectl; .ci/run "
                            "installs it where apt is available)")
#: (check, resource) that the manifests skip, each with its reason there
SKIPPED = {("CKV_K8S_43", "DaemonSet.edgeagent.edgeagent"),
           ("CKV_K8S_25", "DaemonSet.edgeagent.edgeagent"),
           ("CKV_K8S_43", "Deployment.edgeagent.edgeagent-coordinator"),
           ("CKV_K8S_35", "Deployment.edgeagent.edgeagent-coordinator"),
           ("CKV_K8S_43", "StatefulSet.edgeagent.edgeagent-postgres")}
#: what the operator puts in each Secret (docs/operations.md, Kubernetes)
SECRET_KEYS = {"edgeagent-agent": {"admin-token", "coordinator-token"},
               "edgeagent-agent-tls": {"tls.crt", "tls.key", "ca.crt"},
               "edgeagent-coordinator": {"admin-token"},
               "edgeagent-coordinator-tls": {"tls.crt", "tls.key"},
               "edgeagent-postgres": {"password"}}
#: the images, by the name the manifests give them
DOCKERFILES = {"edgeagent": "Dockerfile", "edgeagent-coordinator": "Dockerfile.coordinator"}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> tuple[Path, list[dict]]:
    if KUBECTL is None:
        pytest.skip("no kubectl (Debian: apt-get install kubectl; .ci/run installs it)")
    out = tmp_path_factory.mktemp("kustomize") / "fleet.yaml"
    done = subprocess.run([KUBECTL, "kustomize", str(KUBE)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    out.write_text(done.stdout)
    return out, [d for d in yaml.safe_load_all(done.stdout) if d]


def _one(docs: list[dict], kind: str, name: str) -> dict:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def _pod(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def _container(workload: dict) -> dict:
    (container,) = _pod(workload)["containers"]
    return container


def test_kustomize_renders_the_agent_daemonset_and_the_coordinator_with_its_service(
        rendered):
    _, docs = rendered
    kinds = sorted((d["kind"], d["metadata"]["name"].rsplit("-", 1)[0]
                    if d["kind"] == "ConfigMap" else d["metadata"]["name"]) for d in docs)
    assert kinds == sorted([
        ("Namespace", "edgeagent"), ("ConfigMap", "edgeagent-agent"),
        ("ConfigMap", "edgeagent-coordinator"), ("DaemonSet", "edgeagent"),
        ("Service", "edgeagent"), ("Deployment", "edgeagent-coordinator"),
        ("Service", "edgeagent-coordinator"), ("StatefulSet", "edgeagent-postgres"),
        ("Service", "edgeagent-postgres"), ("NetworkPolicy", "edgeagent-agent"),
        ("NetworkPolicy", "edgeagent-coordinator"), ("NetworkPolicy", "edgeagent-postgres")])
    assert all(d["metadata"].get("namespace") == "edgeagent" for d in docs
               if d["kind"] != "Namespace")
    # each Service selects its workload's pods, on a port they name
    for service, workload in (("edgeagent", ("DaemonSet", "edgeagent")),
                              ("edgeagent-coordinator", ("Deployment", "edgeagent-coordinator")),
                              ("edgeagent-postgres", ("StatefulSet", "edgeagent-postgres"))):
        svc = _one(docs, "Service", service)
        pods = _one(docs, *workload)["spec"]["template"]["metadata"]["labels"]
        assert svc["spec"]["selector"].items() <= pods.items()
        named = {p["name"] for p in _container(_one(docs, *workload))["ports"]}
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= named
    # the pods mount the ConfigMaps kustomize made (their names carry a hash)
    for workload, config in ((("DaemonSet", "edgeagent"), "edgeagent-agent"),
                             (("Deployment", "edgeagent-coordinator"), "edgeagent-coordinator")):
        (volume,) = [v for v in _pod(_one(docs, *workload))["volumes"] if "configMap" in v]
        assert volume["configMap"]["name"].startswith(config + "-")
        assert volume["configMap"]["name"] in {d["metadata"]["name"] for d in docs
                                               if d["kind"] == "ConfigMap"}


def test_every_resource_passes_the_kubernetes_1_30_schemas_strictly(rendered):
    import kubernetes_validate

    _, docs = rendered
    for doc in docs:
        kubernetes_validate.validate(doc, "1.30.0", strict=True)
    # strict: a misspelt field is an error, not ignored
    typo = json.loads(json.dumps(_one(docs, "DaemonSet", "edgeagent")))
    _container(typo)["securityContext"]["readOnlyRootFileSystem"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, "1.30.0", strict=True)


@pytest.mark.skipif(CHECKOV is None, reason="no checkov: `make test` installs it in "
                                            ".venv-scan (make .venv-scan/.installed)")
def test_the_scanner_fails_no_check(rendered, tmp_path):
    path, _ = rendered
    done = subprocess.run(
        [str(CHECKOV), "-f", str(path), "--framework", "kubernetes", "--skip-download",
         "-o", "json"], capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**process_env(), "BC_SKIP_MAPPING": "TRUE"})
    report = json.loads(done.stdout)
    failed = [(c["check_id"], c["resource"], c["check_name"])
              for c in report["results"]["failed_checks"]]
    assert failed == [] and done.returncode == 0, failed
    skipped = {(c["check_id"], c["resource"]): c["check_result"]["suppress_comment"]
               for c in report["results"]["skipped_checks"]}
    assert set(skipped) == SKIPPED
    assert all(len(reason) > 40 for reason in skipped.values()), skipped
    assert report["summary"]["passed"] > 200 and report["summary"]["parsing_errors"] == 0


def _mounted(container: dict, path: str) -> dict | None:
    """The volumeMount that holds ``path`` (the deepest)."""
    holding = [m for m in container["volumeMounts"]
               if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")]
    return max(holding, key=lambda m: len(m["mountPath"]), default=None)


def _volume(workload: dict, mount: dict) -> dict:
    (volume,) = [v for v in _pod(workload)["volumes"] if v["name"] == mount["name"]]
    return volume


def _config_paths(config, *keys: str) -> list[str]:
    values = []
    for key in keys:
        value = config
        for part in key.split("."):
            value = getattr(value, part)
        values.append(str(value))
    return values


def _check_files_are_mounted(workload: dict, paths: list[str], writable: set[str]) -> None:
    container = _container(workload)
    for path in paths:
        mount = _mounted(container, path)
        assert mount is not None, f"{path} is in no volume of {container['name']}"
        volume = _volume(workload, mount)
        if "secret" in volume:
            key = path[len(mount["mountPath"]) + 1:]
            assert key in SECRET_KEYS[volume["secret"]["secretName"]], path
        assert mount.get("readOnly", False) == (path not in writable), path


@needs_kubectl
def test_the_configs_load_and_name_what_the_pods_mount(rendered):
    _, docs = rendered
    agent_set = _one(docs, "DaemonSet", "edgeagent")
    coordinator = _one(docs, "Deployment", "edgeagent-coordinator")
    agent = parse_agent_config(yaml.safe_load((KUBE / "config" / "agent.yaml").read_text()))
    co = load_coordinator_config(KUBE / "config" / "coordinator.yaml")
    _check_files_are_mounted(agent_set, _config_paths(
        agent, "admin_token_file", "tls.cert_file", "tls.key_file", "repository", "data_dir",
        "coordinator.token_file", "coordinator.ca_file"), writable={"/var/lib/edgeagent"})
    _check_files_are_mounted(coordinator, _config_paths(
        co, "admin_token_file", "tls.cert_file", "tls.key_file"), writable=set())
    # the image's state folders are writable volumes (a read-only root file system)
    for workload, dockerfile in ((agent_set, "Dockerfile"),
                                 (coordinator, "Dockerfile.coordinator")):
        env = image_env(dockerfile)
        for key in ("EDGEAGENT_DATA_DIR", "EDGEAGENT_COORDINATOR_DIR", "NUMBA_CACHE_DIR"):
            if key in env:
                mount = _mounted(_container(workload), env[key])
                assert mount is not None and not mount.get("readOnly"), key
    # the coordinator's store is the database's Service, with its user and database
    postgres = _one(docs, "StatefulSet", "edgeagent-postgres")
    pg_env = {e["name"]: e.get("value") for e in _container(postgres)["env"]}
    assert co.store == (f"postgresql://{pg_env['POSTGRES_USER']}@edgeagent-postgres:5432/"
                        f"{pg_env['POSTGRES_DB']}")
    # the agents report to the coordinator's Service, on its port
    svc = _one(docs, "Service", "edgeagent-coordinator")
    assert agent.coordinator.url == f"https://edgeagent-coordinator:{svc['spec']['ports'][0]['port']}"
    assert agent.coordinator.node_name is None  # the DaemonSet's EDGEAGENT_NODE_NAME
    # ports: the configs' own, the containers', the probes'
    ports = {p["name"]: p["containerPort"] for p in _container(agent_set)["ports"]}
    assert ports == {"http": agent.port, "grpc": agent.grpc_port}
    assert [p["containerPort"] for p in _container(coordinator)["ports"]] == [co.port]
    for workload in (agent_set, coordinator):
        container = _container(workload)
        assert "command" not in container  # the image's entrypoint (token, TLS, --host)
        (config_mount,) = [m for m in container["volumeMounts"] if m["name"] == "config"]
        assert container["args"][0] == "--config"
        assert Path(container["args"][1]).parent == Path(config_mount["mountPath"])
    # memory: the agent's limit above its cpu_budget, as systemd's MemoryMax
    limit = _container(agent_set)["resources"]["limits"]["memory"]
    assert limit == "3Gi" and agent.cpu_budget < 3 * 2**30 * 0.75


@needs_kubectl
def test_the_pods_are_hardened_as_the_systemd_units(rendered):
    _, docs = rendered
    for kind, name in (("DaemonSet", "edgeagent"), ("Deployment", "edgeagent-coordinator"),
                       ("StatefulSet", "edgeagent-postgres")):
        pod = _pod(_one(docs, kind, name))
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] > 10000
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            ctx = container["securityContext"]
            assert ctx == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                           "capabilities": {"drop": ["ALL"]}}, (name, ctx)
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]) & set(resources["limits"])
            assert {"livenessProbe", "readinessProbe", "startupProbe"} <= set(container)
    # the one exception: chown of the state's host path, root with CHOWN alone
    (init,) = _pod(_one(docs, "DaemonSet", "edgeagent"))["initContainers"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert init["command"] == ["chown", "10001:10001", "/var/lib/edgeagent"]
    assert init["securityContext"]["allowPrivilegeEscalation"] is False


# -- both pods' commands, run here as kubelet would run them -------------------------------


TOKENS = {"agent": "agent-admin-token-0123456789abcdef0123456789",
          "coordinator": "coordinator-admin-token-0123456789abcdef0123"}


class Pod:
    """A workload's container run here: each mount a folder under ``root``, the
    Secrets' keys files there, the ConfigMap's file rewritten to those folders."""

    def __init__(self, workload: dict, root: Path, secrets: dict[str, dict[str, bytes]],
                 configs: dict[str, str], rewrite: dict[str, str]) -> None:
        self.container = _container(workload)
        self.folders: dict[str, Path] = {}
        for mount in self.container["volumeMounts"]:
            self.folders[mount["mountPath"]] = root / mount["name"]
            self.folders[mount["mountPath"]].mkdir(parents=True, exist_ok=True)
        for mount in self.container["volumeMounts"]:
            folder = self.folders[mount["mountPath"]]
            volume = _volume(workload, mount)
            if "secret" in volume:
                for key, data in secrets[volume["secret"]["secretName"]].items():
                    (folder / key).write_bytes(data)
            elif "configMap" in volume:
                for key, text in configs.items():
                    (folder / key).write_text(self.here(text, rewrite))
        self.dockerfile = DOCKERFILES[self.container["image"].rsplit("/", 1)[-1].split(":")[0]]
        self.log = root / "log"

    def here(self, text: str, rewrite: dict[str, str] | None = None) -> str:
        """``text`` with the pod's paths this test's folders (the deepest mount first),
        then ``rewrite``'s other replacements (the cluster's names and ports)."""
        mounts = "|".join(re.escape(m) for m in sorted(self.folders, key=len, reverse=True))
        text = re.sub(rf"(?<![\w/.-])({mounts})(?=/|$|\s)",  # whole paths, in one pass
                      lambda found: str(self.folders[found.group(1)]), text, flags=re.M)
        for old, new in (rewrite or {}).items():
            text = text.replace(old, new)
        return text

    def start(self, env_values: dict[str, str]) -> Running:
        env = {k: self.here(v) for k, v in image_env(self.dockerfile).items()}
        for item in self.container.get("env", []):
            env[item["name"]] = item["value"] if "value" in item else env_values[item["name"]]
        argv = as_here(exec_form(self.dockerfile, "ENTRYPOINT")) + [
            self.here(a) for a in self.container["args"]]
        return Running(argv, process_env(**env), self.log)


def _probe(container: dict, kind: str, port: int, context) -> bool:
    probe = container[kind]
    if "tcpSocket" in probe:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            return True
    get = probe["httpGet"]
    scheme = get["scheme"].lower()
    return status(f"{scheme}://localhost:{port}{get['path']}", context=context) == 200


@needs_kubectl
def test_the_pods_commands_serve_report_and_answer_their_probes(rendered, postgres,
                                                                tmp_path):
    _, docs = rendered
    ca = make_ca(tmp_path)
    server = issue_cert(ca, tmp_path, "server", hosts=("localhost", "127.0.0.1"))
    tls = {"tls.crt": server.cert_file.read_bytes(), "tls.key": server.key_file.read_bytes()}
    secrets = {"edgeagent-coordinator": {"admin-token": TOKENS["coordinator"].encode()},
               "edgeagent-coordinator-tls": tls,
               "edgeagent-postgres": {"password": b"trust-auth-takes-none"},
               "edgeagent-agent": {"admin-token": TOKENS["agent"].encode(),
                                   "coordinator-token": TOKENS["coordinator"].encode()},
               "edgeagent-agent-tls": {**tls, "ca.crt": ca.cert_file.read_bytes()}}
    context = ssl.create_default_context(cafile=str(ca.cert_file))

    co_pod = Pod(_one(docs, "Deployment", "edgeagent-coordinator"), tmp_path / "co",
                 secrets, {"coordinator.yaml": (KUBE / "config" / "coordinator.yaml").read_text()},
                 {"postgresql://edgeagent@edgeagent-postgres:5432/fleet":
                  postgres.new_database()})
    coordinator = co_pod.start({"PGPASSWORD": "trust-auth-takes-none"})
    agent = None
    try:
        wait_for(lambda: _probe(co_pod.container, "startupProbe", coordinator.port, context),
                 120, "the coordinator's startup probe")
        for kind in ("livenessProbe", "readinessProbe"):
            assert _probe(co_pod.container, kind, coordinator.port, context), kind
        co_url = f"https://localhost:{coordinator.port}"
        assert status(co_url + "/v1/nodes", context=context) == 401

        repo_text = (KUBE / "config" / "agent.yaml").read_text()
        agent_pod = Pod(_one(docs, "DaemonSet", "edgeagent"), tmp_path / "agent", secrets,
                        {"agent.yaml": repo_text},
                        {"https://edgeagent-coordinator:8100": co_url,
                         "grpc_port: 8001": "grpc_port: 0",
                         "coordinator:\n": "coordinator:\n  report_interval_s: 0.5\n"})
        add_mlp(agent_pod.folders["/models"], "m")
        agent = agent_pod.start({"EDGEAGENT_NODE_NAME": "node-a"})
        for kind in ("startupProbe", "livenessProbe"):
            wait_for(lambda: _probe(agent_pod.container, kind, agent.port, context), 60, kind)
        wait_for(lambda: _probe(agent_pod.container, "readinessProbe", agent.port, context),
                 60, "the agent's readiness probe")
        a_url = f"https://localhost:{agent.port}"
        assert status(a_url + "/v1/cache", context=context) == 401
        assert status(a_url + "/v1/cache", TOKENS["agent"], context) == 200

        def reported():
            req = urllib.request.Request(co_url + "/v1/nodes", headers={
                "Authorization": f"Bearer {TOKENS['coordinator']}"})
            with urllib.request.urlopen(req, context=context) as r:
                return [n["name"] for n in json.loads(r.read())] == ["node-a"]

        wait_for(reported, 60, "the agent reports as its node, node-a")
    finally:
        rcs = [agent.stop() if agent else 0, coordinator.stop()]
    assert rcs == [0, 0], [p.read_text()[-2000:] for p in (tmp_path / "co" / "log",
                                                           tmp_path / "agent" / "log")
                           if p.exists()]
