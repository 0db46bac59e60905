# syntax=docker/dockerfile:1
#
# One image for every fedtune process: the API (`fedtune serve`), the study driver
# (`fedtune worker run-study <STUDY_ID>`), the MLflow server (`mlflow server`) and Ray head/worker
# pods (KubeRay runs `ray start ...` in it). See helm/fedtune/README.md for the contract.
#
#   CPU:  docker build -t fedtune:0.1.0 .
#   CUDA: docker build --build-arg TORCH_VARIANT=cuda --build-arg CUDA_TAG=cu128 -t fedtune:0.1.0-cuda .
#   here: make image   (buildah without a daemon, a Debian base and the torch wheel on disk;
#                       deploy/build_image.py, see README "Build the image without Docker")
#
# The CUDA wheels bundle the CUDA runtime libraries, so the base stays python:slim; the nodes
# only need the NVIDIA driver and device plugin.

ARG PYTHON_VERSION=3.11
# Any Debian bookworm image with Python at `python` (and its venv module) and apt; both stages
# use it. Default: the official image. deploy/debian_base.sh makes one from Debian's packages.
ARG BASE_IMAGE=python:${PYTHON_VERSION}-slim-bookworm

# ---- deps: a virtualenv with torch (CPU or CUDA wheels) and the locked dependencies ----------
# No fedtune here: the runtime stage starts from this stage, so the venv's layers (about 2 GB)
# are the image's own, never copied, and a change of fedtune's code never invalidates them;
# fedtune's wheel (under 1 MB) goes on top. (Copying the venv into a stage of its own cost a
# cold buildah build 94 s for the copy and its commit, and 49 s more to delete it after.)
FROM ${BASE_IMAGE} AS deps

# cpu | cuda
ARG TORCH_VARIANT=cpu
# PyTorch wheel index for TORCH_VARIANT=cuda (cu126, cu128, ...)
ARG CUDA_TAG=cu128
# Must equal the torch pin in pyproject.toml (tests/deploy/test_dockerfile.py checks it).
ARG TORCH_VERSION=2.13.0
# Where torch comes from: empty = PyTorch's index of the variant; else a pip --find-links
# location (a directory served over HTTP, e.g. a local mirror holding torch-2.13.0+cpu) whose
# wheel wins over PyPI's (2.13.0+cpu sorts above 2.13.0); torch's own dependencies come from PyPI.
ARG TORCH_FIND_LINKS=""
# Optional extra runtime packages, e.g. "boto3" for MLflow's S3 artifact store.
ARG EXTRA_PIP_PACKAGES=""
# Behind a TLS-intercepting proxy: a CA bundle path that the builder mounts for the build's pip
# (deploy/build_image.py mounts the host's); unset by default, never part of the image.
ARG PIP_CERT

# pip's downloads are cached between builds in a cache mount (never in a layer). The version
# check is off for the build's pip only (an ARG is the RUN steps' environment, not the image's).
ARG PIP_DISABLE_PIP_VERSION_CHECK=1
ENV PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src

# 1. Dependencies, from the lock only: this layer is rebuilt when constraints/image.txt or a
#    build argument changes, never for a code change. torch first, from the index of the chosen
#    variant; the lock's `torch==2.13.0` then finds it satisfied (2.13.0+cpu / +cu128 match).
COPY constraints/image.txt ./constraints/image.txt
RUN --mount=type=cache,target=/root/.cache/pip set -eu; \
    case "$TORCH_VARIANT" in \
      cpu) index=cpu ;; \
      cuda) index="$CUDA_TAG" ;; \
      *) echo "TORCH_VARIANT must be cpu or cuda, got '$TORCH_VARIANT'" >&2; exit 2 ;; \
    esac; \
    if [ -n "$TORCH_FIND_LINKS" ]; then \
      pip install "torch==${TORCH_VERSION}" --find-links "$TORCH_FIND_LINKS"; \
    else \
      pip install "torch==${TORCH_VERSION}" --index-url "https://download.pytorch.org/whl/${index}"; \
    fi
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install -r constraints/image.txt -c constraints/image.txt ${EXTRA_PIP_PACKAGES}

# ---- build: fedtune's wheel, installed over the deps and checked ----------------------------
FROM deps AS build

# cpu | cuda (as in deps: a stage does not inherit the ARGs of the stage it starts from)
ARG TORCH_VARIANT=cpu

# 2. The project itself, without touching the dependencies (`service` includes `tune`: Optuna,
#    Ray Tune, MLflow; never `dev` in an image); `pip check` proves the lock was complete.
COPY pyproject.toml README.md ./
COPY fedtune ./fedtune
RUN pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels . \
    && find pyproject.toml fedtune -type f ! -path '*/__pycache__/*' -print0 | sort -z \
       | xargs -0 sha256sum | sha256sum > /fedtune-source.sha256 \
    && pip install --no-cache-dir --no-deps --no-index --find-links /wheels "fedtune[service]" \
    && pip check \
    && python -c "import torch, fedtune, ray; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'ray', ray.__version__)" \
    && if [ "$TORCH_VARIANT" = cuda ]; then python -c "import sys, torch; sys.exit(0 if torch.version.cuda else 'the CUDA image got a torch without CUDA: ' + torch.__version__)"; fi

# ---- runtime: the virtualenv, a non-root user, nothing else --------------------------------
# From deps: its layers (the venv; the lock stays at /src/constraints/image.txt) are this image's
# first, cached unless the lock or a build argument changes.
FROM deps AS runtime

# bash: KubeRay starts Ray with `/bin/bash -c "ray start ..."`; wget: KubeRay's default probes;
# bubblewrap: the sandbox of uploaded code (fedtune/sandbox.py; setpriv and prlimit are util-linux's).
RUN set -eu; \
    apt-get update; \
    apt-get install -y --no-install-recommends wget bubblewrap; \
    rm -rf /var/lib/apt/lists/*; \
    groupadd --system --gid 10001 fedtune; \
    useradd --system --uid 10001 --gid 10001 --home-dir /home/fedtune --create-home \
      --shell /bin/bash fedtune; \
    install -d -o 10001 -g 10001 /data

# KubeRay < 1.4 starts Ray with `/bin/bash -lc`: a login shell's /etc/profile resets PATH and
# loses /opt/venv/bin (`ray: command not found`). Put the venv back first for login shells, and
# link the commands pods run into /usr/local/bin for any other shell.
RUN set -eu; \
    printf '%s\n' 'case ":$PATH:" in *:/opt/venv/bin:*) ;; *) PATH="/opt/venv/bin:$PATH"; export PATH ;; esac' \
      > /etc/profile.d/fedtune-venv.sh; \
    for tool in fedtune ray mlflow; do ln -s "/opt/venv/bin/$tool" "/usr/local/bin/$tool"; done

# fedtune's wheel from the build stage, mounted rather than copied: a code change rebuilds only
# this small layer. A builder's layer cache does not look into a mounted folder (buildah reused a
# stale fedtune), so the digest of fedtune's source is copied first: a changed source misses the
# cache below.
COPY --from=build /fedtune-source.sha256 /opt/venv/fedtune-source.sha256
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    /opt/venv/bin/pip install --no-cache-dir --no-deps --no-index --find-links /wheels "fedtune[service]"
# The same wheel is the light client that `fedtune serve` hands out to members' laptops at
# /client/ (fedtune/service/client_wheel.py finds it here; `make dist` builds it outside the image).
COPY --from=build /wheels/ /opt/fedtune/client/

# PATH: deps' (/opt/venv/bin first)
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    FEDTUNE_WORKDIR=/data \
    XDG_CACHE_HOME=/tmp/.cache \
    MPLCONFIGDIR=/tmp/matplotlib

WORKDIR /data
USER 10001:10001
EXPOSE 8000

ENTRYPOINT ["fedtune"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
