"""A cluster's pod network in a box: one network namespace per pod, a bridge
between them, Service names that resolve, and the chart's NetworkPolicies enforced by nftables.

What a cluster's network gives pods, and what the box does instead:

=============================== ===================================================================
cluster                         in the box
=============================== ===================================================================
a pod's network namespace       ``ip netns add <tag>-<pod>``; a veth pair whose other end is a port
                                of a bridge in a switch namespace of its own (``<tag>-sw``): no
                                interface of the box is in this machine's namespace, so traffic
                                stays between namespaces the test made
pod IPs                         ``10.<a>.<b>.<n>/24``, one /24 per box (``tag`` picks it)
Service DNS (CoreDNS)           a hosts file per box mapping ``svc``, ``svc.ns``, ``svc.ns.svc`` and
                                ``svc.ns.svc.cluster.local`` to the IP of the pod behind the
                                Service (one pod per Service), for ``--ro-bind`` over ``/etc/hosts``
                                or ``/etc/netns/<netns>/hosts`` (``ip netns exec`` binds it)
NetworkPolicy (a CNI's engine)  :func:`ingress_rules` evaluates the policies with Kubernetes'
                                semantics; :meth:`NetBox.enforce` writes the result as an nftables
                                ``inet`` table in each selected pod's namespace: ``input`` policy
                                ``drop`` (default-deny for a pod any Ingress policy selects), loopback
                                and established/related accepted, then one counted ``accept`` per
                                allowed (source pod, port), its comment naming the policy and flow
=============================== ===================================================================

The semantics implemented (``networking.k8s.io/v1``, ingress only — the chart renders no egress
policies): a pod is isolated when a policy of its namespace selects it (``podSelector``
``matchLabels``/``matchExpressions`` with ``In``/``NotIn``/``Exists``/``DoesNotExist``; ``{}`` selects
all) and lists ``Ingress`` in ``policyTypes`` (or has ``ingress`` rules and no ``policyTypes``); it
then accepts a connection when some rule of some selecting policy matches both the source (no
``from``: any; else a peer: ``podSelector`` in the policy's namespace, ``namespaceSelector``
(namespace labels: ``kubernetes.io/metadata.name``), both together, or ``ipBlock`` with
``except``) and the port (no ``ports``: any; else ``port`` by number or by the destination
container's port name, ``protocol`` TCP unless said, ``endPort``). Peers are the box's pods: a
source outside the box is matched by ``ipBlock`` only.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["BoxPod", "Flow", "NetBox", "box_missing", "ingress_rules", "matches", "selects"]

NETNS_DIR = Path("/etc/netns")


def box_missing() -> str | None:
    """None when this machine can make the box (root, ``ip``, ``nft``, netns), else why not."""
    import os

    if os.geteuid() != 0:
        return "network namespaces and nftables need root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (apt-get install -y iproute2 nftables)"
    probe = f"ftprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    try:
        nft = subprocess.run(
            ["ip", "netns", "exec", probe, "nft", "list", "ruleset"], capture_output=True, text=True
        )
        if nft.returncode != 0:
            return f"nftables does not work in a network namespace: {nft.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


# ---- the policies' semantics ----------------------------------------------------------------
def matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A LabelSelector against ``labels``; ``{}`` (or no selector) selects everything."""
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], set(expr.get("values") or ())
        present = key in labels
        ok = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[op]
        if not ok:
            return False
    return True


@dataclass(frozen=True)
class BoxPod:
    """A pod of the box: its labels and named container ports as rendered, its namespace."""

    name: str
    labels: Mapping[str, str]
    ports: Mapping[str, int] = field(default_factory=dict)
    namespace: str = "ml"
    netns: str = ""
    ip: str = ""


def selects(policy: Mapping[str, Any], pod: BoxPod) -> bool:
    """Whether ``policy`` isolates ``pod`` for ingress."""
    spec = policy["spec"]
    if policy["metadata"].get("namespace", pod.namespace) != pod.namespace:
        return False
    types = spec.get("policyTypes") or (["Ingress"] if "ingress" in spec else [])
    return "Ingress" in types and matches(spec.get("podSelector"), pod.labels)


def _peer_sources(peer: Mapping[str, Any], policy_ns: str, pods: Iterable[BoxPod]) -> list[str]:
    """Source addresses (CIDRs) one ``from`` peer admits."""
    if "ipBlock" in peer:
        block = ipaddress.ip_network(peer["ipBlock"]["cidr"], strict=False)
        excluded = [
            ipaddress.ip_network(c, strict=False) for c in peer["ipBlock"].get("except", [])
        ]
        nets = [block]
        for ex in excluded:
            nets = [
                piece
                for net in nets
                for piece in (net.address_exclude(ex) if ex.subnet_of(net) else [net])
            ]
        return [str(n) for n in nets]
    out = []
    for pod in pods:
        if "namespaceSelector" in peer:
            ns_labels = {"kubernetes.io/metadata.name": pod.namespace}
            if not matches(peer["namespaceSelector"], ns_labels):
                continue
        elif pod.namespace != policy_ns:
            continue
        if "podSelector" in peer and not matches(peer["podSelector"], pod.labels):
            continue
        out.append(f"{pod.ip}/32")
    return out


def _ports(rule: Mapping[str, Any], dest: BoxPod) -> list[tuple[str, str]] | None:
    """``[(protocol, "port" or "lo-hi")]`` a rule admits on ``dest``; None: every port."""
    if not rule.get("ports"):
        return None
    out = []
    for item in rule["ports"]:
        proto = str(item.get("protocol", "TCP")).lower()
        port = item.get("port")
        if port is None:
            return None  # a protocol with every port: treat as every port (TCP only here)
        number = dest.ports.get(port) if isinstance(port, str) else int(port)
        if number is None:
            continue  # a named port this pod does not declare admits nothing on it
        end = item.get("endPort")
        out.append((proto, f"{number}-{int(end)}" if end else str(number)))
    return out


@dataclass(frozen=True)
class Rule:
    """One accepted (sources, port) of a destination pod, from one policy."""

    policy: str
    sources: tuple[str, ...] | None  # None: any source
    ports: tuple[tuple[str, str], ...] | None  # None: any port


def ingress_rules(
    policies: Iterable[Mapping[str, Any]], dest: BoxPod, pods: Iterable[BoxPod]
) -> list[Rule] | None:
    """What ``dest`` accepts under ``policies``: None when no policy isolates it (everything)."""
    pods = list(pods)
    selecting = [p for p in policies if selects(p, dest)]
    if not selecting:
        return None
    rules = []
    for policy in selecting:
        ns = policy["metadata"].get("namespace", dest.namespace)
        for rule in policy["spec"].get("ingress") or []:
            peers = rule.get("from")
            sources = (
                None
                if not peers
                else tuple(sorted({s for peer in peers for s in _peer_sources(peer, ns, pods)}))
            )
            ports = _ports(rule, dest)
            if sources == () or ports == []:
                continue  # admits no one
            rules.append(
                Rule(policy["metadata"]["name"], sources, None if ports is None else tuple(ports))
            )
    return rules


def nft_table(rules: list[Rule], names: Mapping[str, str], dest: BoxPod) -> str:
    """The ``inet netbox`` table that enforces ``rules`` in ``dest``'s namespace."""
    lines = [
        "table inet netbox {",
        "  chain input {",
        "    type filter hook input priority 0; policy drop;",
        "    iif lo accept",
        "    ct state established,related accept",
    ]
    for rule in rules:
        for source in rule.sources or (None,):
            for proto, port in rule.ports or ((None, None),):
                who = names.get(source, source or "any")
                flow = f"{rule.policy}: {who} -> {dest.name}:{port or 'any'}"
                match = f"ip saddr {source} " if source else ""
                if proto is not None:
                    match += f"{proto} dport {port} "
                lines.append(f'    {match}counter accept comment "{flow}"')
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


# ---- the namespaces ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Flow:
    """An accepted flow the counters saw: the rule's comment and its packet count."""

    comment: str
    packets: int


class NetBox:
    """The namespaces of one box. ``tag`` (≤ 6 characters) names them and picks the /24."""

    def __init__(self, tag: str, octets: tuple[int, int]) -> None:
        self.tag = tag
        self.net = f"10.{octets[0]}.{octets[1]}"
        self.switch = f"{tag}-sw"
        self.pods: dict[str, BoxPod] = {}
        self._procs: list[subprocess.Popen] = []
        self._netns: list[str] = []
        _ip("netns", "add", self.switch)
        self._netns.append(self.switch)
        _ip("-n", self.switch, "link", "set", "lo", "up")
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")

    def add_pod(
        self,
        name: str,
        labels: Mapping[str, str],
        ports: Mapping[str, int] | None = None,
        namespace: str = "ml",
    ) -> BoxPod:
        index = len(self.pods) + 2
        netns = f"{self.tag}-{name}"
        _ip("netns", "add", netns)
        self._netns.append(netns)
        inner, outer = f"{self.tag}i{index}", f"{self.tag}o{index}"
        _ip(
            "link",
            "add",
            inner,
            "netns",
            netns,
            "type",
            "veth",
            "peer",
            "name",
            outer,
            "netns",
            self.switch,
        )
        _ip("-n", netns, "link", "set", inner, "name", "eth0")
        ip = f"{self.net}.{index}"
        _ip("-n", netns, "addr", "add", f"{ip}/24", "dev", "eth0")
        _ip("-n", netns, "link", "set", "eth0", "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        _ip("-n", self.switch, "link", "set", outer, "master", "br0")
        _ip("-n", self.switch, "link", "set", outer, "up")
        pod = BoxPod(name, dict(labels), dict(ports or {}), namespace, netns, ip)
        self.pods[name] = pod
        return pod

    def hosts(self, services: Mapping[str, str]) -> str:
        """``/etc/hosts`` text: each ``service`` name (every DNS form) -> its pod's IP."""
        lines = ["127.0.0.1 localhost"]
        for service, pod_name in services.items():
            pod = self.pods[pod_name]
            forms = [
                service,
                f"{service}.{pod.namespace}",
                f"{service}.{pod.namespace}.svc",
                f"{service}.{pod.namespace}.svc.cluster.local",
            ]
            lines.append(f"{pod.ip} {' '.join(forms)}")
        return "\n".join(lines) + "\n"

    def publish_hosts(self, text: str) -> None:
        """Write ``text`` as ``/etc/netns/<netns>/hosts`` of every pod (``ip netns exec`` binds it)."""
        for pod in self.pods.values():
            folder = NETNS_DIR / pod.netns
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "hosts").write_text(text)

    def enforce(self, policies: list[Mapping[str, Any]]) -> dict[str, list[Rule] | None]:
        """Write each pod's table (replacing an earlier one); returns the rules per pod."""
        names = {f"{p.ip}/32": p.name for p in self.pods.values()}
        applied = {}
        for pod in self.pods.values():
            rules = ingress_rules(policies, pod, self.pods.values())
            applied[pod.name] = rules
            subprocess.run(
                ["ip", "netns", "exec", pod.netns, "nft", "delete", "table", "inet", "netbox"],
                capture_output=True,
            )
            if rules is not None:
                table = nft_table(rules, names, pod)
                subprocess.run(
                    ["ip", "netns", "exec", pod.netns, "nft", "-f", "-"],
                    input=table,
                    text=True,
                    check=True,
                    capture_output=True,
                )
        return applied

    def flows(self) -> list[Flow]:
        """The accept rules whose counters saw packets, in every pod's namespace."""
        seen = []
        for pod in self.pods.values():
            out = subprocess.run(
                ["ip", "netns", "exec", pod.netns, "nft", "-j", "list", "table", "inet", "netbox"],
                capture_output=True,
                text=True,
            )
            if out.returncode != 0:
                continue
            for item in json.loads(out.stdout)["nftables"]:
                rule = item.get("rule")
                if not rule or "comment" not in rule:
                    continue
                counter = next((e["counter"] for e in rule["expr"] if "counter" in e), None)
                if counter and counter["packets"] > 0:
                    seen.append(Flow(rule["comment"], int(counter["packets"])))
        return seen

    def resolve(self, src: str, name: str) -> str | None:
        """``name`` as ``src``'s resolver answers it (``/etc/netns/<netns>/hosts``); None: unknown."""
        code = (
            "import socket,sys\ntry:\n print(socket.gethostbyname(sys.argv[1]))\n"
            "except OSError:\n print('')\n"
        )
        out = subprocess.run(
            self.exec_argv(src, [sys.executable, "-c", code, name]),
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return out.stdout.strip() or None

    def exec_argv(self, pod: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.pods[pod].netns, *argv]

    def listen(self, pod: str, port: int) -> subprocess.Popen:
        """A TCP server on ``port`` of ``pod`` that answers each connection with the pod's name."""
        code = (
            "import socket,sys\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,"
            "socket.SO_REUSEADDR,1);s.bind(('0.0.0.0',int(sys.argv[1])));s.listen(16)\n"
            "print('ready',flush=True)\nwhile True:\n c,_=s.accept();c.sendall(sys.argv[2]"
            ".encode());c.close()\n"
        )
        proc = subprocess.Popen(
            self.exec_argv(pod, [sys.executable, "-c", code, str(port), pod]),
            stdout=subprocess.PIPE,
            text=True,
        )
        self._procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        return proc

    def connect(self, src: str, dst: str, port: int, timeout: float = 1.5) -> bool:
        """Whether a TCP connection from ``src`` reaches ``dst``'s listener on ``port``."""
        return self.probe(src, [(dst, port)], timeout)[(dst, port)]

    def probe(
        self, src: str, targets: list[tuple[str, int]], timeout: float = 1.5
    ) -> dict[tuple[str, int], bool]:
        """:meth:`connect` to each target at once (one process in ``src``'s namespace, one thread
        per target): a refused connection costs one ``timeout`` for all of them."""
        code = (
            "import json,socket,sys\nfrom concurrent.futures import ThreadPoolExecutor\n"
            "t=float(sys.argv[1]);targets=json.loads(sys.argv[2])\n"
            "def one(x):\n try:\n  c=socket.create_connection((x[0],x[1]),timeout=t)\n"
            "  c.settimeout(t);return c.recv(64).decode()\n except OSError:\n  return None\n"
            "with ThreadPoolExecutor(len(targets) or 1) as pool:\n"
            " print(json.dumps(list(pool.map(one,targets))))\n"
        )
        where = [(self.pods[dst].ip, port) for dst, port in targets]
        out = subprocess.run(
            self.exec_argv(src, [sys.executable, "-c", code, str(timeout), json.dumps(where)]),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        answers = json.loads(out.stdout)
        return {
            (dst, port): answer == dst for (dst, port), answer in zip(targets, answers, strict=True)
        }

    def remove_pod(self, name: str) -> None:
        """The pod is gone (its node lost): its namespace is deleted, taking its interface with
        it; the caller has stopped its processes."""
        pod = self.pods.pop(name)
        subprocess.run(["ip", "netns", "del", pod.netns], capture_output=True)
        self._netns.remove(pod.netns)
        shutil.rmtree(NETNS_DIR / pod.netns, ignore_errors=True)

    def close(self) -> None:
        for proc in self._procs:
            with contextlib.suppress(OSError):
                proc.kill()
            with contextlib.suppress(Exception):
                proc.wait(10)
        for netns in reversed(self._netns):
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
            shutil.rmtree(NETNS_DIR / netns, ignore_errors=True)
        self._netns.clear()

    def __enter__(self) -> NetBox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
