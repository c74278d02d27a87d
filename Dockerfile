# The node agent in a container: the default install (ONNX; no TensorFlow), a non-root
# user, the model repository and the agent's state on volumes. Serves the generated demo
# when started without --repository (see docs/operations.md, "Docker"). The agent runs its policy
# kernels interpreted (no numba compile); NUMBA_CACHE_DIR is for `edgeagent simulate`.
#   docker build -t edgeagent .
#   docker run --rm -p 8000:8000 -v "$PWD/models:/models:ro" edgeagent --repository /models
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    EDGEAGENT_DATA_DIR=/var/lib/edgeagent \
    NUMBA_CACHE_DIR=/opt/edgeagent/numba-cache

WORKDIR /opt/edgeagent/src
COPY pyproject.toml README.md ./
COPY agent ./agent
COPY cachepolicies ./cachepolicies
RUN pip install . \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/edgeagent \
               --create-home edgeagent \
    && mkdir -p /models "$NUMBA_CACHE_DIR" \
    && chown -R edgeagent:edgeagent /var/lib/edgeagent "$NUMBA_CACHE_DIR" \
    && cd / && rm -rf /opt/edgeagent/src

WORKDIR /var/lib/edgeagent
USER edgeagent
VOLUME ["/models", "/var/lib/edgeagent"]
EXPOSE 8000 8001
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=4)"]
# The container's port is published by docker (-p), so the agent binds every interface:
# the demo runs with --insecure (no TLS, no token); arguments given to `docker run`
# replace it, and then the agent refuses to start without tls and admin_token_file
# (a config file) unless they say --insecure again (docs/operations.md, Security).
ENTRYPOINT ["edgeagent", "serve", "--host", "0.0.0.0", "--port", "8000"]
CMD ["--insecure"]
