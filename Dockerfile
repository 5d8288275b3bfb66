# The gpuadm image. Build from the repository root: docker build -t <registry>/gpuadm:0.1.0 .
#
# A full version tag, so a rebuild gets the same Python and Debian release; bump it on purpose.
FROM python:3.11.15-slim-bookworm

# No .pyc writes at run time (the root filesystem is read-only in the cluster; pip already
# compiled them at install), unbuffered logs, and no pip version check on every build.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A named user with the fixed UID the manifests run as, so tools that look the user up
# (getpass, ~ expansion) find one.
RUN groupadd --gid 65532 gpuadm \
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin gpuadm

WORKDIR /src
COPY pyproject.toml README.md ./
COPY policies/ policies/
COPY webhook/ webhook/
COPY certs/ certs/
# The `fast` extra adds uvloop; every dependency ships wheels, so no compiler is needed.
RUN pip install --no-cache-dir ".[fast]" \
    && rm -rf /src

WORKDIR /
# Numeric, so the kubelet can check runAsNonRoot without reading /etc/passwd.
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["gpuadm"]
CMD ["serve"]
