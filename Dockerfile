# The node agent in a container: the default install (the agent alone: ONNX Runtime, no
# simulator, coordinator or TensorFlow), a non-root user, the model repository and the
# agent's state on volumes. Serves the generated demo when started without --repository
# (see docs/operations.md, "Docker"). It needs an admin token (and takes TLS files) from
# a mounted secret or a file an environment variable names, or an explicit --insecure.
# The coordinator has its own image: Dockerfile.coordinator.
#   docker build -t edgeagent .
#   openssl rand -hex 32 > admin-token
#   docker run --rm -p 8000:8000 -v "$PWD/admin-token:/run/secrets/edgeagent/admin-token:ro" \
#       -v "$PWD/models:/models:ro" edgeagent --repository /models
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    EDGEAGENT_DATA_DIR=/var/lib/edgeagent

WORKDIR /opt/edgeagent/src
COPY pyproject.toml README.md ./
COPY agent ./agent
COPY cachepolicies ./cachepolicies
RUN pip install . \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/edgeagent \
               --create-home edgeagent \
    && mkdir -p /models \
    && chown -R edgeagent:edgeagent /var/lib/edgeagent \
    && cd / && rm -rf /opt/edgeagent/src

WORKDIR /var/lib/edgeagent
USER edgeagent
VOLUME ["/models", "/var/lib/edgeagent"]
EXPOSE 8000 8001
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-m", "agent.container", "probe", "127.0.0.1:8000/v2/health/ready"]
# The container's port is published by docker (-p), so the agent binds every interface:
# agent/container.py runs `edgeagent serve` with the admin token (and TLS) from
# /run/secrets/edgeagent (admin-token, tls.crt, tls.key) or the files that
# EDGEAGENT_ADMIN_TOKEN_FILE, EDGEAGENT_TLS_CERT_FILE and EDGEAGENT_TLS_KEY_FILE name;
# without a token it refuses to start and says how to give one. Arguments to `docker run`
# go to `edgeagent serve` (--config FILE: the config names its own files; --insecure:
# serve in the clear, the operator's choice).
ENTRYPOINT ["python", "-m", "agent.container", "serve", "--host", "0.0.0.0", "--port", "8000"]
