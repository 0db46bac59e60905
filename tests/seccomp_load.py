"""Apply a Kubernetes ``Localhost`` seccomp profile the way a container runtime does.

Run with Debian's Python and ``python3-seccomp`` (libseccomp's bindings, which runc also
builds its filters with)::

    /usr/bin/python3 tests/seccomp_load.py bpf PROFILE OUT      # the compiled filter, for
                                                                # ``bwrap --seccomp FD``
    /usr/bin/python3 tests/seccomp_load.py exec PROFILE -- CMD  # load it, then exec CMD

A profile is read as runc reads it: the default action and errno, the architectures, and each
rule's names and action; a name libseccomp does not know is skipped. Fields this loader does
not implement (argument conditions, notify actions) are refused rather than ignored.
"""

from __future__ import annotations

import errno
import json
import os
import sys

import seccomp

_ACTIONS = {"SCMP_ACT_ALLOW", "SCMP_ACT_ERRNO", "SCMP_ACT_KILL", "SCMP_ACT_KILL_PROCESS"}


def _action(name: str, errno_ret: int | None) -> int:
    if name not in _ACTIONS:
        raise SystemExit(f"seccomp_load: action {name} is not implemented here")
    if name == "SCMP_ACT_ALLOW":
        return seccomp.ALLOW
    if name == "SCMP_ACT_ERRNO":
        return seccomp.ERRNO(errno.EPERM if errno_ret is None else errno_ret)
    return seccomp.KILL_PROCESS if name == "SCMP_ACT_KILL_PROCESS" else seccomp.KILL


def build(path: str) -> seccomp.SyscallFilter:
    """The filter of the profile at ``path``."""
    with open(path) as handle:
        profile = json.load(handle)
    extra = set(profile) - {"defaultAction", "defaultErrnoRet", "architectures", "syscalls"}
    if extra:
        raise SystemExit(f"seccomp_load: fields {sorted(extra)} are not implemented here")
    flt = seccomp.SyscallFilter(_action(profile["defaultAction"], profile.get("defaultErrnoRet")))
    for arch in profile.get("architectures", []):
        value = getattr(seccomp.Arch, arch.removeprefix("SCMP_ARCH_"))
        if not flt.exist_arch(value):  # the native one is there from the start
            flt.add_arch(value)
    for rule in profile["syscalls"]:
        if set(rule) - {"names", "action", "errnoRet"}:
            raise SystemExit(f"seccomp_load: rule fields {sorted(rule)} are not implemented here")
        action = _action(rule["action"], rule.get("errnoRet"))
        for name in rule["names"]:
            try:
                flt.add_rule(action, name)
            except (ValueError, RuntimeError):
                continue  # unknown to libseccomp: runc skips it too
    return flt


def main(argv: list[str]) -> None:
    mode, path, *rest = argv
    flt = build(path)
    if mode == "bpf":
        with open(rest[0], "wb") as out:
            flt.export_bpf(out)
        return
    if mode == "exec" and rest[:1] == ["--"] and rest[1:]:
        flt.load()
        os.execvp(rest[1], rest[1:])
    raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
