"""The Pod Security Standards checker (tests/pss_restricted.py): every control, both ways."""

from __future__ import annotations

import copy

import pytest

from tests.pss_restricted import object_violations, pod_specs, violations


def compliant() -> dict:
    """A pod that passes Restricted (the documented minimum)."""
    return {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "initContainers": [_container("init")],
        "containers": [_container("main")],
        "ephemeralContainers": [_container("debug")],
        "volumes": [{"name": "tmp", "emptyDir": {}}],
    }


def _container(name: str) -> dict:
    return {
        "name": name,
        "image": "x",
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }


def test_compliant_pod_passes_both_levels():
    assert violations(compliant(), "restricted") == []
    assert violations(compliant(), "baseline") == []


def test_default_pod_passes_baseline_but_not_restricted():
    pod = {"containers": [{"name": "c", "image": "x"}]}
    assert violations(pod, "baseline") == []
    found = violations(pod, "restricted")
    for control in ("privilege escalation", "runAsNonRoot", "seccomp", "capabilities"):
        assert any(line.startswith(control) for line in found), (control, found)


def _set(path: str, value):
    def mutate(pod: dict) -> None:
        keys = path.split(".")
        node = pod
        for key in keys[:-1]:
            if "[" in key:
                name, idx = key[:-1].split("[")
                node = node[name][int(idx)]
            else:
                node = node.setdefault(key, {})
        node[keys[-1]] = value

    return mutate


KINDS = ("initContainers", "containers", "ephemeralContainers")
# (control, mutation that violates it, level at which it applies)
CASES = [
    ("HostProcess", _set("securityContext.windowsOptions", {"hostProcess": True}), "baseline"),
    ("host namespaces", _set("hostNetwork", True), "baseline"),
    ("host namespaces", _set("hostPID", True), "baseline"),
    ("host namespaces", _set("hostIPC", True), "baseline"),
    ("hostPath volumes", _set("volumes", [{"name": "h", "hostPath": {"path": "/"}}]), "baseline"),
    ("AppArmor", _set("securityContext.appArmorProfile", {"type": "Unconfined"}), "baseline"),
    ("SELinux", _set("securityContext.seLinuxOptions", {"type": "spc_t"}), "baseline"),
    ("SELinux", _set("securityContext.seLinuxOptions", {"user": "system_u"}), "baseline"),
    ("SELinux", _set("securityContext.seLinuxOptions", {"role": "sysadm_r"}), "baseline"),
    ("seccomp", _set("securityContext.seccompProfile", {"type": "Unconfined"}), "baseline"),
    (
        "sysctls",
        _set("securityContext.sysctls", [{"name": "kernel.msgmax", "value": "1"}]),
        "baseline",
    ),
    (
        "volume types",
        _set("volumes", [{"name": "n", "nfs": {"server": "s", "path": "/"}}]),
        "restricted",
    ),
    ("runAsNonRoot", _set("securityContext.runAsNonRoot", False), "restricted"),
    ("runAsUser", _set("securityContext.runAsUser", 0), "restricted"),
    ("seccomp", _set("securityContext.seccompProfile", {}), "restricted"),
]
for kind in KINDS:
    sc = f"{kind}[0].securityContext"
    CASES += [
        ("HostProcess", _set(f"{sc}.windowsOptions", {"hostProcess": True}), "baseline"),
        ("privileged", _set(f"{sc}.privileged", True), "baseline"),
        (
            "capabilities",
            _set(f"{sc}.capabilities", {"drop": ["ALL"], "add": ["SYS_ADMIN"]}),
            "baseline",
        ),
        (
            "host ports",
            _set(f"{kind}[0].ports", [{"containerPort": 80, "hostPort": 80}]),
            "baseline",
        ),
        ("AppArmor", _set(f"{sc}.appArmorProfile", {"type": "Unconfined"}), "baseline"),
        ("SELinux", _set(f"{sc}.seLinuxOptions", {"type": "unconfined_t"}), "baseline"),
        ("/proc mount", _set(f"{sc}.procMount", "Unmasked"), "baseline"),
        ("seccomp", _set(f"{sc}.seccompProfile", {"type": "Unconfined"}), "baseline"),
        (
            "capabilities",
            _set(f"{sc}.capabilities", {"drop": ["ALL"], "add": ["CHOWN"]}),
            "restricted",
        ),
        ("capabilities", _set(f"{sc}.capabilities", {"drop": ["NET_RAW"]}), "restricted"),
        ("privilege escalation", _set(f"{sc}.allowPrivilegeEscalation", True), "restricted"),
        ("runAsNonRoot", _set(f"{sc}.runAsNonRoot", False), "restricted"),
        ("runAsUser", _set(f"{sc}.runAsUser", 0), "restricted"),
    ]


@pytest.mark.parametrize(
    "control,mutate,level", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_each_control_flags_its_violation(control, mutate, level):
    pod = compliant()
    mutate(pod)
    found = violations(pod, "restricted")
    assert any(line.startswith(control) for line in found), found
    if level == "baseline":
        assert any(line.startswith(control) for line in violations(pod, "baseline"))
    else:
        assert violations(pod, "baseline") == []


# The compliant side of each control: values the standard allows.
ALLOWED = [
    _set("securityContext.windowsOptions", {"hostProcess": False}),
    _set("hostNetwork", False),
    _set(
        "volumes",
        [
            {"name": v, v: {}}
            for v in ("configMap", "csi", "downwardAPI", "ephemeral", "projected", "secret")
        ]
        + [{"name": "p", "persistentVolumeClaim": {"claimName": "c"}}],
    ),
    _set("securityContext.appArmorProfile", {"type": "Localhost", "localhostProfile": "p"}),
    _set("securityContext.seLinuxOptions", {"type": "container_init_t", "level": "s0:c1"}),
    _set("securityContext.seccompProfile", {"type": "Localhost", "localhostProfile": "p"}),
    _set(
        "securityContext.sysctls",
        [
            {"name": "net.ipv4.tcp_keepalive_time", "value": "60"},
            {"name": "kernel.shm_rmid_forced", "value": "1"},
        ],
    ),
    _set("securityContext.runAsUser", 10001),
    _set(
        "containers[0].securityContext.capabilities", {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}
    ),
    _set("containers[0].ports", [{"containerPort": 80, "hostPort": 0}]),
    _set("containers[0].securityContext.procMount", "Default"),
    _set("containers[0].securityContext.appArmorProfile", {"type": "RuntimeDefault"}),
    _set("containers[0].securityContext.privileged", False),
    _set("containers[0].securityContext.runAsNonRoot", True),
    _set("containers[0].securityContext.runAsUser", 1000),
]


@pytest.mark.parametrize("mutate", ALLOWED)
def test_allowed_values_pass(mutate):
    pod = compliant()
    mutate(pod)
    assert violations(pod, "restricted") == []


def test_seccomp_and_non_root_may_be_set_per_container_instead_of_pod():
    pod = compliant()
    pod["securityContext"] = {}
    for kind in KINDS:
        pod[kind][0]["securityContext"].update(
            runAsNonRoot=True, seccompProfile={"type": "RuntimeDefault"}
        )
    assert violations(pod) == []
    del pod["ephemeralContainers"][0]["securityContext"]["seccompProfile"]
    assert [v.split(":")[0] for v in violations(pod)] == ["seccomp"]


def test_windows_pods_skip_linux_only_restricted_controls():
    pod = {
        "os": {"name": "windows"},
        "securityContext": {"runAsNonRoot": True},
        "containers": [{"name": "c"}],
    }
    assert violations(pod) == []


def test_apparmor_beta_annotation():
    key = "container.apparmor.security.beta.kubernetes.io/main"
    assert violations(compliant(), annotations={key: "unconfined"})
    assert violations(compliant(), annotations={key: "runtime/default"}) == []
    assert violations(compliant(), annotations={key: "localhost/prof"}) == []


def test_unknown_level_is_refused():
    with pytest.raises(ValueError, match="level"):
        violations(compliant(), "privileged-ish")


def _tmpl(spec):
    return {"metadata": {"labels": {}}, "spec": copy.deepcopy(spec)}


def test_pod_specs_reaches_every_pod_of_every_workload_kind():
    bad = {"containers": [{"name": "c"}]}
    objs = [
        {"kind": "Pod", "metadata": {"name": "p"}, "spec": bad},
        {"kind": "Deployment", "spec": {"template": _tmpl(bad)}},
        {"kind": "StatefulSet", "spec": {"template": _tmpl(bad)}},
        {"kind": "DaemonSet", "spec": {"template": _tmpl(bad)}},
        {"kind": "Job", "spec": {"template": _tmpl(bad)}},
        {"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"template": _tmpl(bad)}}}},
    ]
    for obj in objs:
        assert len(pod_specs(obj)) == 1 and object_violations(obj), obj["kind"]
    assert pod_specs({"kind": "Service", "spec": {}}) == []


def test_pod_specs_ray_objects_head_every_worker_group_and_submitter():
    cluster = {
        "headGroupSpec": {"template": _tmpl(compliant())},
        "workerGroupSpecs": [
            {"groupName": "a", "template": _tmpl(compliant())},
            {"groupName": "b", "template": _tmpl({"containers": [{}]})},
        ],
    }
    ray_cluster = {"kind": "RayCluster", "metadata": {"name": "rc"}, "spec": cluster}
    assert [w for w, _ in pod_specs(ray_cluster)] == [
        "RayCluster/rc head",
        "RayCluster/rc worker group a",
        "RayCluster/rc worker group b",
    ]
    assert all(
        line.startswith("RayCluster/rc worker group b") for line in object_violations(ray_cluster)
    )

    job = {
        "kind": "RayJob",
        "metadata": {"name": "j"},
        "spec": {"rayClusterSpec": copy.deepcopy(cluster)},
    }
    job["spec"]["rayClusterSpec"]["workerGroupSpecs"].pop()
    # no submitterPodTemplate: KubeRay's default submitter (no security context) is a violation
    assert object_violations(job) and all(
        "submitter (KubeRay default)" in line for line in object_violations(job)
    )
    job["spec"]["submitterPodTemplate"] = _tmpl(compliant())
    assert len(pod_specs(job)) == 3 and object_violations(job) == []
    job["spec"]["submitterPodTemplate"]["spec"]["hostPID"] = True
    assert object_violations(job) == ["RayJob/j submitter: host namespaces: spec.hostPID is true"]
    del job["spec"]["submitterPodTemplate"]
    job["spec"]["submissionMode"] = "HTTPMode"
    assert len(pod_specs(job)) == 2 and object_violations(job) == []
