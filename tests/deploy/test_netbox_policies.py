"""The chart's NetworkPolicies, enforced between network namespaces (the
network of the cluster in a box; tests/deploy/netbox.py).

The chart is rendered with backend ``ray`` and its shared RayCluster; every pod it runs gets a
namespace of its own with the rendered labels (the RayCluster's pods also get the labels KubeRay
adds: ``ray.io/cluster``, ``ray.io/node-type``), two Ray workers, plus a "laptop" outside the
cluster and an "intruder": a pod of the release's namespace with labels of no fedtune
component. Each pod listens on its rendered container ports (a Ray pod also on 12345, standing
for the ports Ray picks at run time). Then every source × (destination, port) connection is
tried and compared with the table below, written from the policies' documented intent
(``helm/fedtune/templates/networkpolicy.yaml``), not computed by the translation under test.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest

from tests.deploy.conftest import RELEASE, find, pod_specs
from tests.deploy.netbox import NetBox, box_missing, ingress_rules, matches
from tests.needs import need

pytestmark = [pytest.mark.box]

FULLNAME = f"{RELEASE}-fedtune"
RAY = f"{FULLNAME}-ray"
DYNAMIC = 12345  # a port Ray picks at run time (raylet, object manager, workers)
SOURCES = (
    "laptop",
    "intruder",
    "api",
    "db-upgrade",
    "mlflow",
    "postgresql",
    "ray-head",
    "ray-worker-1",
    "ray-worker-2",
)
FEDTUNE_PODS = {
    "api",
    "db-upgrade",
    "mlflow",
    "postgresql",
    "ray-head",
    "ray-worker-1",
    "ray-worker-2",
}
RAY_PODS = {"ray-head", "ray-worker-1", "ray-worker-2"}

#: (destination, port) -> the sources the policies admit (everyone else is refused)
EXPECTED: dict[tuple[str, int], set[str]] = {
    # no policy selects the API: anyone, the laptop included
    ("api", 8000): set(SOURCES),
    # PostgreSQL: the API, MLflow and the migration Job; no Ray pod (drivers report to the API)
    ("postgresql", 5432): {"api", "mlflow", "db-upgrade"},
    # MLflow: fedtune pods of this release (Ray's included), not the laptop or the intruder
    ("mlflow", 5000): FEDTUNE_PODS,
    # the dashboard / Jobs API: the API and the cluster's own pods
    ("ray-head", 8265): RAY_PODS | {"api"},
    # every other Ray port: the cluster's own pods only
    ("ray-head", 6379): RAY_PODS,
    ("ray-head", 10001): RAY_PODS,
    ("ray-head", DYNAMIC): RAY_PODS,
    ("ray-worker-1", DYNAMIC): RAY_PODS,
}


def chart_pods(
    render, values: dict[str, Any] | None = None
) -> tuple[list[dict], dict[str, tuple[dict[str, str], dict[str, int]]], dict[str, str]]:
    """The rendered NetworkPolicies, ``pod -> (labels, named ports)`` for the box, and
    ``Service name -> pod`` (each rendered Service's selector; KubeRay's head Service added)."""
    manifests = render(values or {"backend": "ray", "rayCluster": {"enabled": True}})
    pods: dict[str, tuple[dict[str, str], dict[str, int]]] = {}
    for manifest in manifests:
        for where, meta, spec in pod_specs(manifest):
            labels = dict((meta or {}).get("labels") or {})
            component = labels.get("app.kubernetes.io/component")
            if component == "test":
                continue  # the helm test pod
            ports = {
                p.get("name") or str(p["containerPort"]): p["containerPort"]
                for c in spec["containers"]
                for p in c.get("ports", [])
            }
            if manifest["kind"] == "RayCluster":  # what KubeRay adds to the pods it creates
                labels |= {
                    "ray.io/cluster": manifest["metadata"]["name"],
                    "ray.io/node-type": "head" if where == "head" else "worker",
                }
                ports["dynamic"] = DYNAMIC
            if where.startswith("worker"):
                for n in (1, 2):
                    pods[f"ray-worker-{n}"] = (labels, ports)
            else:
                pods[component] = (labels, ports)
    services = {f"{RAY}-head-svc": "ray-head"}  # KubeRay creates it for the head
    for service in find(manifests, "Service"):
        selector = {"matchLabels": service["spec"].get("selector") or {}}
        [target] = [name for name, (labels, _) in pods.items() if matches(selector, labels)]
        services[service["metadata"]["name"]] = target
    return find(manifests, "NetworkPolicy"), pods, services


@pytest.fixture
def box(render):
    need("box", box_missing())
    policies, pods, services = chart_pods(render)
    assert set(pods) == FEDTUNE_PODS, sorted(pods)
    assert services[FULLNAME] == "api" and services[f"{FULLNAME}-postgresql"] == "postgresql"
    tag = f"nb{os.getpid() % 10000}"
    with NetBox(tag, (233, os.getpid() % 250)) as made:
        for name in SOURCES:
            labels, ports = pods.get(name, ({}, {}))
            if name == "intruder":
                labels = {"app.kubernetes.io/name": "something-else"}
            made.add_pod(name, labels, ports, namespace="laptop" if name == "laptop" else "ml")
        for dest, port in EXPECTED:
            made.listen(dest, port)
        made.publish_hosts(made.hosts(services))
        yield made, policies, services


def _reachable(made: NetBox) -> dict[tuple[str, int], set[str]]:
    reached: dict[tuple[str, int], set[str]] = {key: set() for key in EXPECTED}
    for src in SOURCES:
        targets = [key for key in EXPECTED if key[0] != src]
        for key, ok in made.probe(src, targets).items():
            if ok:
                reached[key].add(src)
    return reached


def test_the_rendered_policies_admit_exactly_the_documented_flows(box) -> None:
    made, policies, services = box
    # Service names resolve in every pod as cluster DNS would answer them
    for service, pod in services.items():
        for name in (service, f"{service}.ml.svc", f"{service}.ml.svc.cluster.local"):
            assert made.resolve("laptop", name) == made.pods[pod].ip, name
    assert made.resolve("ray-worker-1", f"{RAY}-head-svc") == made.pods["ray-head"].ip
    assert {p["metadata"]["name"] for p in policies} == {
        f"{FULLNAME}-postgresql",
        f"{FULLNAME}-mlflow",
        RAY,
    }
    # without policies (a CNI that does not enforce them) every flow goes through
    made.enforce([])
    assert _reachable(made) == {key: set(SOURCES) - {key[0]} for key in EXPECTED}

    applied = made.enforce(policies)
    assert applied["api"] is None and applied["laptop"] is None  # not isolated
    got = _reachable(made)
    expected = {key: allowed - {key[0]} for key, allowed in EXPECTED.items()}
    assert got == expected
    for flow in sorted(made.flows(), key=lambda f: f.comment):
        print(f"allowed: {flow.comment} ({flow.packets} packets)")
    assert any(f.comment.startswith(f"{RAY}: api -> ray-head:8265") for f in made.flows())


def test_a_port_removed_from_a_policy_is_refused(box) -> None:
    """The control: the Ray policy without port 8265 in its API rule refuses the API (whose
    Ray Jobs client could then submit no study), while the cluster's own pods still connect."""
    made, policies, _ = box
    edited = copy.deepcopy(policies)
    [ray] = [p for p in edited if p["metadata"]["name"] == RAY]
    api_rule = next(r for r in ray["spec"]["ingress"] if r.get("ports"))
    api_rule["ports"] = [p for p in api_rule["ports"] if p["port"] != 8265] or [
        {"port": 8266, "protocol": "TCP"}  # keep the rule a port rule: none of the ones listened
    ]
    made.enforce(edited)
    assert not made.connect("api", "ray-head", 8265)
    assert made.connect("ray-worker-1", "ray-head", 8265)
    made.enforce(policies)
    assert made.connect("api", "ray-head", 8265)


def test_the_semantics_of_selectors_ports_and_ip_blocks() -> None:
    """:func:`ingress_rules` on hand-made policies: named and numbered ports, ``endPort``,
    ``matchExpressions``, ``namespaceSelector``, ``ipBlock`` with ``except``, empty ``from``."""
    from tests.deploy.netbox import BoxPod, nft_table

    web = BoxPod("web", {"app": "web", "tier": "front"}, {"http": 80}, "ml", "x", "10.0.0.2")
    db = BoxPod("db", {"app": "db"}, {"pg": 5432}, "ml", "y", "10.0.0.3")
    ops = BoxPod("ops", {"app": "ops"}, {}, "ops", "z", "10.0.0.4")
    pods = [web, db, ops]

    def policy(spec: dict[str, Any], ns: str = "ml") -> dict[str, Any]:
        return {"metadata": {"name": "p", "namespace": ns}, "spec": spec}

    assert ingress_rules([], db, pods) is None
    assert ingress_rules([policy({"podSelector": {}, "policyTypes": ["Egress"]})], db, pods) is None
    deny_all = ingress_rules([policy({"podSelector": {}, "policyTypes": ["Ingress"]})], db, pods)
    assert deny_all == []
    rules = ingress_rules(
        [
            policy(
                {
                    "podSelector": {
                        "matchExpressions": [{"key": "app", "operator": "In", "values": ["db"]}]
                    },
                    "ingress": [
                        {
                            "from": [{"podSelector": {"matchLabels": {"app": "web"}}}],
                            "ports": [{"port": "pg"}],
                        },
                        {
                            "from": [
                                {
                                    "namespaceSelector": {
                                        "matchLabels": {"kubernetes.io/metadata.name": "ops"}
                                    }
                                }
                            ],
                            "ports": [{"port": 9000, "endPort": 9010}],
                        },
                        {"from": [{"ipBlock": {"cidr": "10.0.0.0/30", "except": ["10.0.0.2/32"]}}]},
                        {
                            "ports": [{"port": "nope"}]
                        },  # a port name db does not declare: admits nothing
                    ],
                }
            )
        ],
        db,
        pods,
    )
    assert rules is not None
    assert [(r.sources, r.ports) for r in rules] == [
        (("10.0.0.2/32",), (("tcp", "5432"),)),
        (("10.0.0.4/32",), (("tcp", "9000-9010"),)),
        (("10.0.0.0/31", "10.0.0.3/32"), None),
    ]
    table = nft_table(rules, {"10.0.0.2/32": "web"}, db)
    assert "policy drop;" in table and "ip saddr 10.0.0.2/32 tcp dport 5432 counter accept" in table
    assert 'comment "p: web -> db:5432"' in table


#: the labels fedtune's ``rayjob_manifest`` gives a RayJob's head pod (the chart's RayJob policy
#: selects ``component: study, managed-by: fedtune``), with KubeRay's node type
RAYJOB_HEAD = {
    "app.kubernetes.io/component": "study",
    "app.kubernetes.io/managed-by": "fedtune",
    "ray.io/node-type": "head",
}


def test_the_kuberay_operator_reaches_each_rayjob_heads_dashboard(render) -> None:
    """With backend ``kubernetes`` the RayJob policy admitted port 8265 only
    from the study's own pods, so KubeRay's RayJob controller (``GetJobInfo`` from its own
    namespace) could never read a job's status. The rendered policy now admits the operator's
    namespace there — and only there."""
    need("box", box_missing())
    manifests = render({"backend": "kubernetes"})
    policies = find(manifests, "NetworkPolicy")
    [rayjobs] = [p for p in policies if p["metadata"]["name"] == f"{FULLNAME}-rayjobs"]
    assert matches(rayjobs["spec"]["podSelector"], RAYJOB_HEAD)
    tag = f"nk{os.getpid() % 10000}"
    with NetBox(tag, (232, os.getpid() % 250)) as made:
        made.add_pod("rayjob-head", RAYJOB_HEAD, {"dashboard": 8265})
        made.add_pod("submitter", {k: v for k, v in RAYJOB_HEAD.items() if k != "ray.io/node-type"})
        made.add_pod(
            "operator", {"app.kubernetes.io/name": "kuberay-operator"}, namespace="kuberay-system"
        )
        made.add_pod(
            "elsewhere", {"app.kubernetes.io/name": "kuberay-operator"}, namespace="default"
        )
        made.listen("rayjob-head", 8265)
        made.listen("rayjob-head", 6379)
        made.enforce(policies)
        reach = {
            src: made.probe(src, [("rayjob-head", 8265), ("rayjob-head", 6379)])
            for src in ("operator", "elsewhere", "submitter")
        }
        assert reach["operator"] == {("rayjob-head", 8265): True, ("rayjob-head", 6379): False}
        assert reach["elsewhere"] == {("rayjob-head", 8265): False, ("rayjob-head", 6379): False}
        assert reach["submitter"] == {("rayjob-head", 8265): True, ("rayjob-head", 6379): True}
        # the policy as it was rendered before the fix: no rule for the operator's namespace
        before = copy.deepcopy(policies)
        [old] = [p for p in before if p["metadata"]["name"] == f"{FULLNAME}-rayjobs"]
        old["spec"]["ingress"] = [
            r
            for r in old["spec"]["ingress"]
            if not any("namespaceSelector" in f for f in r.get("from", []))
        ]
        made.enforce(before)
        assert not made.connect("operator", "rayjob-head", 8265)
