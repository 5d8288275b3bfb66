# The gpuadm image. Build from the repository root:
#
#   docker build -t <registry>/gpuadm:0.3.0-rc.1 \
#       --build-arg VERSION=0.3.0-rc.1 --build-arg REVISION="$(git rev-parse HEAD)" .
#
# BASE is any image with Python 3.11 and its venv module, groupadd and useradd. The default is
# the official Python image at a full version tag and at the digest of one build of that tag
# (its index, for every platform), so a rebuild gets the same Python and the same Debian
# packages; bump both on purpose, together.
# `make image` builds the same file on a base made locally from Debian bookworm's own packages
# (python3, python3-venv), with no registry but Debian's mirror and PyPI; see image/build.sh.
ARG BASE=python:3.11.15-slim-bookworm@sha256:d29f48a31a8b408ed19272ca1e7b10ebae13b240a27e862d3d4217c528e2e0c3
FROM ${BASE}

# No .pyc writes at run time (the root filesystem is read-only in the cluster; pip already
# compiled gpuadm's at install), unbuffered logs, and no pip version check or cache in the
# build. gpuadm lives in its own venv: Debian's python3 refuses a system-wide pip install
# (PEP 668), and the venv keeps gpuadm's dependencies apart from the base's on any base. Its
# bin/ comes first on PATH, so `gpuadm` is found as the entrypoint and as a pod's command.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PATH=/opt/gpuadm/bin:$PATH

# A named user with the fixed UID the manifests run as, so tools that look the user up
# (getpass, ~ expansion) find one.
RUN groupadd --gid 65532 gpuadm \
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin gpuadm

COPY pyproject.toml README.md /src/
COPY policies/ /src/policies/
COPY webhook/ /src/webhook/
COPY certs/ /src/certs/
# The `fast` extra adds uvloop; every dependency ships wheels, so no compiler is needed. The
# venv's own pip and setuptools go once gpuadm is in: nothing runs them after the build.
RUN python3 -m venv /opt/gpuadm \
    && /opt/gpuadm/bin/pip install "/src[fast]" \
    && /opt/gpuadm/bin/pip uninstall --yes pip setuptools \
    && rm -rf /src

# Last: labels are metadata, so a new version or revision rebuilds no layer. base.name says
# which base the image was built on, the default above or a local one.
ARG BASE
ARG VERSION=0.3.0-rc.1
ARG REVISION=unknown
LABEL org.opencontainers.image.title="gpuadm" \
      org.opencontainers.image.description="Kubernetes admission webhook for GPU classes and per-namespace GPU quotas" \
      org.opencontainers.image.source="https://github.com/gpuadm/gpuadm" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="${BASE}"

# Numeric, so the kubelet can check runAsNonRoot without reading /etc/passwd.
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["gpuadm"]
CMD ["serve"]
