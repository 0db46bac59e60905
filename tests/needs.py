"""What a test needs from the machine, and what happens when it is missing.

Outside CI a missing PostgreSQL, Chromium, Helm SDK, bubblewrap or KubeRay CRD skips the test
and prints why. A variable turns each skip into a failure, so CI cannot go green by skipping:
``.ci/run`` sets them all.

============ ===============================
need         variable that makes it required
============ ===============================
postgres     ``FEDTUNE_REQUIRE_POSTGRES=1``
chromium     ``FEDTUNE_REQUIRE_CHROMIUM=1``
helm         ``FEDTUNE_REQUIRE_HELM=1``
crds         ``FEDTUNE_REQUIRE_CRDS=1``
bwrap        ``FEDTUNE_REQUIRE_BWRAP=1``
image        ``FEDTUNE_REQUIRE_IMAGE=1``  (buildah, root: the built image's root file system)
box          ``FEDTUNE_REQUIRE_BOX=1``  (root, ``ip`` and ``nft``: network namespaces, nftables)
seccomp      ``FEDTUNE_REQUIRE_SECCOMP=1``  (Debian's ``python3-seccomp``: loading a profile)
nginx        ``FEDTUNE_REQUIRE_NGINX=1``  (Debian's ``nginx``: the TLS proxy of a team's network)
============ ===============================

The KubeRay CRDs are read from ``FEDTUNE_CRD_DIR``, by default ``../shared/k8s/crds`` beside
the checkout.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
REQUIRE_VARS = {
    "postgres": "FEDTUNE_REQUIRE_POSTGRES",
    "chromium": "FEDTUNE_REQUIRE_CHROMIUM",
    "helm": "FEDTUNE_REQUIRE_HELM",
    "crds": "FEDTUNE_REQUIRE_CRDS",
    "bwrap": "FEDTUNE_REQUIRE_BWRAP",
    "image": "FEDTUNE_REQUIRE_IMAGE",
    "box": "FEDTUNE_REQUIRE_BOX",
    "seccomp": "FEDTUNE_REQUIRE_SECCOMP",
    "nginx": "FEDTUNE_REQUIRE_NGINX",
}


def crd_dir() -> Path:
    """Where KubeRay's CRDs are: ``$FEDTUNE_CRD_DIR`` or ``../shared/k8s/crds``."""
    env = os.environ.get("FEDTUNE_CRD_DIR")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "k8s" / "crds"


def required(need: str) -> bool:
    """Whether the environment demands ``need`` (its FEDTUNE_REQUIRE_* variable is 1)."""
    return os.environ.get(REQUIRE_VARS[need], "") == "1"


def need(what: str, missing_reason: str | None) -> None:
    """Go on when ``missing_reason`` is None; else skip with the reason printed, or fail when
    the variable of ``what`` requires it."""
    if missing_reason is None:
        return
    if required(what):
        pytest.fail(
            f"{what} is required ({REQUIRE_VARS[what]}=1) but {missing_reason}", pytrace=False
        )
    print(f"\nSKIP ({what}): {missing_reason}")
    pytest.skip(missing_reason)
