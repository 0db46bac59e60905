"""The Kubernetes Pod Security Standards (Baseline and Restricted), as published.

Source: https://kubernetes.io/docs/concepts/security/pod-security-standards/ (the policy tables,
Kubernetes v1.30+ wording) and the reference implementation it describes, the Pod Security
Admission controller (``k8s.io/pod-security-admission/policy/check_*.go``). Every control of both
levels is here, applied to ``initContainers``, ``containers`` and ``ephemeralContainers``:

Baseline   HostProcess · host namespaces · privileged · capabilities (baseline add-list) ·
           hostPath volumes · host ports · AppArmor (field and beta annotation) · SELinux ·
           /proc mount · seccomp (no Unconfined) · sysctls (safe set)
Restricted everything in Baseline, plus volume types (allow-list) · privilege escalation ·
           runAsNonRoot · runAsUser != 0 · seccomp (RuntimeDefault/Localhost required at pod or
           every container) · capabilities (drop ALL, add only NET_BIND_SERVICE)

As in the standard, the Linux-only Restricted controls (privilege escalation, seccomp,
capabilities) do not apply to pods with ``spec.os.name: windows``.

API:
    violations(pod_spec, level="restricted", annotations=None) -> list[str]
    pod_specs(obj) -> list[(where, pod_spec)]       Pod, Deployment, StatefulSet, DaemonSet,
                                                     ReplicaSet, Job, CronJob, RayCluster, RayJob
    object_violations(obj, level="restricted") -> list[str]   every pod of ``obj``

A RayJob in ``K8sJobMode`` (the default) without ``submitterPodTemplate`` runs KubeRay's
default submitter pod, which has no security context at all: :func:`pod_specs` returns that
implied pod so a missing template is a violation, not a blind spot.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["LEVELS", "object_violations", "pod_specs", "pod_templates", "violations"]

LEVELS = ("baseline", "restricted")
CONTAINER_KINDS = ("initContainers", "containers", "ephemeralContainers")

BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
RESTRICTED_ADD_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
SELINUX_TYPES = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
RESTRICTED_VOLUME_TYPES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
SECCOMP_CONFINED = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_TYPES = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"


def _containers(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for kind in CONTAINER_KINDS:
        for i, c in enumerate(spec.get(kind) or []):
            yield f"spec.{kind}[{i}]({c.get('name', '?')})", c


def _sc(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("securityContext") or {}


def _baseline(spec: dict[str, Any], annotations: dict[str, str]) -> list[str]:
    out: list[str] = []
    pod_sc = _sc(spec)
    if (pod_sc.get("windowsOptions") or {}).get("hostProcess"):
        out.append("HostProcess: spec.securityContext.windowsOptions.hostProcess is true")
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            out.append(f"host namespaces: spec.{field} is true")
    for i, vol in enumerate(spec.get("volumes") or []):
        if vol.get("hostPath") is not None:
            out.append(f"hostPath volumes: spec.volumes[{i}]({vol.get('name')}) is a hostPath")
    out += _apparmor("spec.securityContext", pod_sc)
    out += _selinux("spec.securityContext", pod_sc)
    seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    if seccomp == "Unconfined":
        out.append("seccomp: spec.securityContext.seccompProfile.type is Unconfined")
    for i, sysctl in enumerate(pod_sc.get("sysctls") or []):
        if sysctl.get("name") not in SAFE_SYSCTLS:
            out.append(
                f"sysctls: spec.securityContext.sysctls[{i}] {sysctl.get('name')!r} "
                "is not in the safe set"
            )
    for key, value in (annotations or {}).items():
        if key.startswith(APPARMOR_ANNOTATION) and not (
            value == "runtime/default" or value.startswith("localhost/")
        ):
            out.append(f"AppArmor: annotation {key}={value!r}")
    for where, c in _containers(spec):
        out += _baseline_container(where, c)
    return out


def _apparmor(where: str, sc: dict[str, Any]) -> list[str]:
    kind = (sc.get("appArmorProfile") or {}).get("type")
    if kind is not None and kind not in APPARMOR_TYPES:
        return [f"AppArmor: {where}.appArmorProfile.type is {kind!r}"]
    return []


def _selinux(where: str, sc: dict[str, Any]) -> list[str]:
    opts = sc.get("seLinuxOptions") or {}
    out = []
    if opts.get("type", "") not in SELINUX_TYPES:
        out.append(f"SELinux: {where}.seLinuxOptions.type is {opts.get('type')!r}")
    for field in ("user", "role"):
        if opts.get(field):
            out.append(f"SELinux: {where}.seLinuxOptions.{field} is set")
    return out


def _baseline_container(where: str, c: dict[str, Any]) -> list[str]:
    out: list[str] = []
    sc = _sc(c)
    w = f"{where}.securityContext"
    if (sc.get("windowsOptions") or {}).get("hostProcess"):
        out.append(f"HostProcess: {w}.windowsOptions.hostProcess is true")
    if sc.get("privileged"):
        out.append(f"privileged: {w}.privileged is true")
    added = set((sc.get("capabilities") or {}).get("add") or [])
    if added - BASELINE_CAPABILITIES:
        out.append(
            f"capabilities: {w}.capabilities.add has {sorted(added - BASELINE_CAPABILITIES)}"
        )
    for j, port in enumerate(c.get("ports") or []):
        if port.get("hostPort"):
            out.append(f"host ports: {where}.ports[{j}].hostPort is {port['hostPort']}")
    out += _apparmor(w, sc)
    out += _selinux(w, sc)
    if sc.get("procMount", "Default") != "Default":
        out.append(f"/proc mount: {w}.procMount is {sc['procMount']!r}")
    if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
        out.append(f"seccomp: {w}.seccompProfile.type is Unconfined")
    return out


def _restricted(spec: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for i, vol in enumerate(spec.get("volumes") or []):
        kinds = set(vol) - {"name"}
        if not kinds <= RESTRICTED_VOLUME_TYPES:
            out.append(
                f"volume types: spec.volumes[{i}]({vol.get('name')}) is "
                f"{sorted(kinds - RESTRICTED_VOLUME_TYPES)}"
            )
    pod_sc = _sc(spec)
    pod_non_root = pod_sc.get("runAsNonRoot")
    if pod_non_root is False:
        out.append("runAsNonRoot: spec.securityContext.runAsNonRoot is false")
    if pod_sc.get("runAsUser") == 0:
        out.append("runAsUser: spec.securityContext.runAsUser is 0")
    linux = ((spec.get("os") or {}).get("name") or "linux") != "windows"
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    if linux and pod_seccomp is not None and pod_seccomp not in SECCOMP_CONFINED:
        out.append(f"seccomp: spec.securityContext.seccompProfile.type is {pod_seccomp!r}")
    for where, c in _containers(spec):
        sc = _sc(c)
        w = f"{where}.securityContext"
        if sc.get("runAsNonRoot") is False:
            out.append(f"runAsNonRoot: {w}.runAsNonRoot is false")
        elif sc.get("runAsNonRoot") is None and pod_non_root is not True:
            out.append(f"runAsNonRoot: neither spec.securityContext nor {w} sets it to true")
        if sc.get("runAsUser") == 0:
            out.append(f"runAsUser: {w}.runAsUser is 0")
        if linux:
            out += _restricted_linux(w, sc, pod_seccomp)
    return out


def _restricted_linux(w: str, sc: dict[str, Any], pod_seccomp: str | None) -> list[str]:
    out: list[str] = []
    if sc.get("allowPrivilegeEscalation") is not False:
        out.append(f"privilege escalation: {w}.allowPrivilegeEscalation is not false")
    seccomp = (sc.get("seccompProfile") or {}).get("type")
    if seccomp is None and pod_seccomp is None:
        out.append(
            f"seccomp: neither spec.securityContext nor {w} sets "
            "seccompProfile RuntimeDefault/Localhost"
        )
    elif seccomp is not None and seccomp not in SECCOMP_CONFINED:
        out.append(f"seccomp: {w}.seccompProfile.type is {seccomp!r}")
    caps = sc.get("capabilities") or {}
    if "ALL" not in (caps.get("drop") or []):
        out.append(f"capabilities: {w}.capabilities.drop does not include ALL")
    added = set(caps.get("add") or []) - RESTRICTED_ADD_CAPABILITIES
    if added:
        out.append(f"capabilities: {w}.capabilities.add has {sorted(added)}")
    return out


def violations(
    pod_spec: dict[str, Any], level: str = "restricted", annotations: dict[str, str] | None = None
) -> list[str]:
    """Every control of ``level`` that ``pod_spec`` (a PodSpec dict) violates, one line each.

    ``annotations``: the pod's metadata annotations (the AppArmor beta annotation is a control).
    """
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, not {level!r}")
    out = _baseline(pod_spec, annotations or {})
    if level == "restricted":
        out += _restricted(pod_spec)
    return out


def _template(where: str, template: dict[str, Any] | None) -> list[tuple[str, dict, dict]]:
    if not template:
        return []
    return [(where, template.get("metadata") or {}, template.get("spec") or {})]


def _ray_cluster(where: str, spec: dict[str, Any]) -> list[tuple[str, dict, dict]]:
    out = _template(f"{where} head", (spec.get("headGroupSpec") or {}).get("template"))
    for group in spec.get("workerGroupSpecs") or []:
        out += _template(f"{where} worker group {group.get('groupName')}", group.get("template"))
    return out


KUBERAY_DEFAULT_SUBMITTER = {"containers": [{"name": "ray-job-submitter"}]}


def pod_templates(obj: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """``(where, pod metadata, pod spec)`` for every pod that ``obj`` creates."""
    kind, spec = obj.get("kind"), obj.get("spec") or {}
    where = f"{kind}/{(obj.get('metadata') or {}).get('name', '?')}"
    if kind == "Pod":
        return [(where, obj.get("metadata") or {}, spec)]
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        return _template(where, spec.get("template"))
    if kind == "CronJob":
        return _template(where, ((spec.get("jobTemplate") or {}).get("spec") or {}).get("template"))
    if kind == "RayCluster":
        return _ray_cluster(where, spec)
    if kind == "RayJob":
        out = _ray_cluster(where, spec.get("rayClusterSpec") or {})
        if spec.get("submitterPodTemplate"):
            out += _template(f"{where} submitter", spec["submitterPodTemplate"])
        elif spec.get("submissionMode", "K8sJobMode") == "K8sJobMode":
            out.append((f"{where} submitter (KubeRay default)", {}, KUBERAY_DEFAULT_SUBMITTER))
        return out
    return []


def pod_specs(obj: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(where, pod spec)`` for every pod that ``obj`` creates (see :func:`pod_templates`)."""
    return [(where, spec) for where, _, spec in pod_templates(obj)]


def object_violations(obj: dict[str, Any], level: str = "restricted") -> list[str]:
    """:func:`violations` of every pod of ``obj``, each line prefixed with where it is."""
    return [
        f"{where}: {line}"
        for where, meta, spec in pod_templates(obj)
        for line in violations(spec, level, meta.get("annotations"))
    ]
