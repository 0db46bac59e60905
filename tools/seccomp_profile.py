"""Write the seccomp profile of the containers that run bubblewrap (the code-check sandbox).

    /usr/bin/python3 tools/seccomp_profile.py --write   # rewrite the chart's profile
    /usr/bin/python3 tools/seccomp_profile.py --check   # exit 1 when the committed one differs

Run it with Debian's Python and its ``python3-seccomp`` (libseccomp's own bindings), which
name every system call libseccomp knows on x86_64 and arm64. The profile allows each of them
except :data:`DENIED`; the container runtime refuses everything else (calls it does not know
get ``ENOSYS`` from runc, so a C library falls back). Why this list, and what it adds to the
runtime's default, is in ``docs/explanation/threat-model.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "helm" / "fedtune" / "files" / "seccomp" / "code-sandbox.json"
ARCHES = {"x86_64": "SCMP_ARCH_X86_64", "aarch64": "SCMP_ARCH_AARCH64"}

#: what the profile refuses, by group: each is refused by the container runtimes' default
#: profiles too (Docker's, containerd's RuntimeDefault) to a container without the capability
#: that would make the call useful, and none of it is needed by the API, Ray or bubblewrap
DENIED: dict[str, tuple[str, ...]] = {
    "kernel modules": (
        "create_module",
        "delete_module",
        "finit_module",
        "get_kernel_syms",
        "init_module",
        "query_module",
    ),
    "kexec and reboot": ("kexec_file_load", "kexec_load", "reboot"),
    "the kernel keyring": ("add_key", "keyctl", "request_key"),
    "tracing and other processes' memory": (
        "bpf",
        "kcmp",
        "lookup_dcookie",
        "perf_event_open",
        "process_vm_readv",
        "process_vm_writev",
        "ptrace",
    ),
    "the clock": ("clock_adjtime", "clock_settime", "settimeofday"),
    "swap, accounting and quotas": ("acct", "quotactl", "quotactl_fd", "swapoff", "swapon"),
    "I/O ports and old modes": ("ioperm", "iopl", "vm86", "vm86old"),
    "file handles (open_by_handle_at walks out of a mount)": (
        "name_to_handle_at",
        "open_by_handle_at",
    ),
    "memory policy": (
        "get_mempolicy",
        "mbind",
        "migrate_pages",
        "move_pages",
        "set_mempolicy",
        "set_mempolicy_home_node",
    ),
    "the new mount API (bubblewrap uses mount(2))": (
        "fsconfig",
        "fsmount",
        "fsopen",
        "fspick",
        "mount_setattr",
        "move_mount",
        "open_tree",
    ),
    "joining other processes' namespaces": ("setns",),
    "io_uring": ("io_uring_enter", "io_uring_register", "io_uring_setup"),
    "userfaultfd": ("userfaultfd",),
    "the kernel log and terminals": ("syslog", "vhangup"),
    "obsolete or unimplemented": (
        "_sysctl",
        "afs_syscall",
        "getpmsg",
        "nfsservctl",
        "putpmsg",
        "security",
        "sysfs",
        "tuxcall",
        "uselib",
        "ustat",
        "vserver",
    ),
}

#: what bubblewrap needs and RuntimeDefault refuses to a process without CAP_SYS_ADMIN; the
#: kernel allows each only inside a user namespace the process made (the container has no
#: capability of its own)
FOR_BUBBLEWRAP = ("clone", "clone3", "mount", "pivot_root", "umount2", "unshare")


def known_syscalls() -> list[str]:
    """Every system call libseccomp names on the profile's architectures.

    Returns:
        The sorted names.
    """
    import seccomp  # Debian's python3-seccomp: only this tool and the tests need it

    names: set[str] = set()
    for arch in ("X86_64", "AARCH64"):
        for number in range(1100):
            try:
                names.add(seccomp.resolve_syscall(getattr(seccomp.Arch, arch), number).decode())
            except (ValueError, RuntimeError):
                continue
    return sorted(names)


def profile(known: list[str]) -> dict:
    """The profile: every known call but :data:`DENIED` allowed, the rest refused.

    Args:
        known: every system call name libseccomp knows.

    Returns:
        The profile in the format of a Kubernetes ``Localhost`` profile (runc's).
    """
    denied = {name for group in DENIED.values() for name in group}
    missing = [name for name in FOR_BUBBLEWRAP if name not in known]
    if missing:
        raise SystemExit(f"libseccomp does not know {missing}: a newer python3-seccomp is needed")
    return {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": 1,
        "architectures": sorted(ARCHES.values()),
        "syscalls": [
            {"names": [n for n in known if n not in denied], "action": "SCMP_ACT_ALLOW"},
            # refused by the default action too; listed so that a reader sees what is refused
            {"names": [n for n in known if n in denied], "action": "SCMP_ACT_ERRNO", "errnoRet": 1},
        ],
    }


def render(known: list[str]) -> str:
    """The profile's file text (one call per line, so that a change reads as a diff)."""
    return json.dumps(profile(known), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite the chart's profile")
    mode.add_argument("--check", action="store_true", help="exit 1 when it is stale")
    args = parser.parse_args(argv)
    text = render(known_syscalls())
    if args.write:
        PROFILE.parent.mkdir(parents=True, exist_ok=True)
        PROFILE.write_text(text)
        return 0
    if PROFILE.exists() and PROFILE.read_text() == text:
        return 0
    print(
        f"{PROFILE.relative_to(REPO)} is stale: /usr/bin/python3 tools/seccomp_profile.py --write"
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
