# The two commands: `make run` and `make test`. Each creates .venv on first use.
# `make run` installs the default dependencies only: the node agent (no simulator,
# coordinator or TensorFlow); `make tour` adds the sim and coordinator extras that the
# README's tour steps 3 and 4 use; `make test` adds the test extra (which brings the sim,
# coordinator and postgres extras) and bench, and the manifest scanner in .venv-scan.
# `make dist` builds the sdist and wheel.
# `make run PORT=8010 GRPC_PORT=8011 HOST=127.0.0.1` picks the address (GRPC_PORT=0: no
# gRPC endpoint); a non-loopback HOST needs TLS and a token, or ARGS=--insecure for the
# demo in the clear (`make run HOST=0.0.0.0 ARGS=--insecure`).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-run
TOUR_STAMP := $(VENV)/.installed-tour
TEST_STAMP := $(VENV)/.installed-test
# checkov, the manifest scanner tests/test_kubernetes.py runs on deploy/kubernetes, in a
# venv of its own: it pins versions (boto3, packaging, networkx) older than the test
# extra's.
SCAN_VENV := .venv-scan
SCAN_STAMP := $(SCAN_VENV)/.installed
CHECKOV ?= checkov==3.3.30
HOST ?= 127.0.0.1
PORT ?= 8000
GRPC_PORT ?= 8001
ARGS ?=
URL := http://$(HOST):$(PORT)

.PHONY: run tour test test-slow bench clean protos dist

# The venv's own pip (ensurepip's) installs all this project needs: no upgrade to wait for.
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(RUN_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $(RUN_STAMP)

# The extras are a superset of the default install: the run stamp is good after these
# too (and the tour's after the test's, whose extra holds sim and coordinator).
$(TOUR_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[sim,coordinator]'
	touch $(TOUR_STAMP) $(RUN_STAMP)

$(TEST_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test,bench]'
	touch $(TEST_STAMP) $(TOUR_STAMP) $(RUN_STAMP)

# The simulator's and the planner's extras (tour steps 3 and 4), into the same .venv.
tour: $(TOUR_STAMP)
	@echo "the sim and coordinator extras are in $(VENV): simulate, workload and plan work"

$(SCAN_STAMP):
	$(PYTHON) -m venv $(SCAN_VENV)
	$(SCAN_VENV)/bin/python -m pip install -q "$(CHECKOV)"
	touch $(SCAN_STAMP)

run: $(RUN_STAMP)
	@echo "Starting the node agent on the embedded demo. Query it from another shell:"
	@echo "  curl -s $(URL)/v1/models/classifier:predict -d '{\"instances\": [[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]]}'"
	@echo "  $(BIN)/edgeagent cache ls --url $(URL)"
	@echo "  KServe v2 gRPC (tritonclient.grpc) on $(HOST):$(GRPC_PORT)"
	$(BIN)/edgeagent serve --host $(HOST) --port $(PORT) --grpc-port $(GRPC_PORT) $(ARGS)

# The quick suite, in parallel: pytest-xdist, TEST_WORKERS processes, each test module
# whole in one of them (--dist loadfile: a module's fixtures, such as the TF Serving
# servers or the PostgreSQL cluster, are built once, and its tests run in their order).
# The slow tests (`-m slow`: the soak) run on their own: `make test-slow`; .ci/run runs
# both.
TEST_WORKERS ?= 4
test: $(TEST_STAMP) $(SCAN_STAMP)
	$(BIN)/python -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile

test-slow: $(TEST_STAMP)
	$(BIN)/python -m pytest -q -m slow

# The committed gRPC modules, regenerated from their .proto files by the pinned
# grpcio-tools in a throwaway venv: KServe v2 in agent/node/protos/ and TF Serving's in
# agent/backends/tfserving_pb/ (each package's regenerate.py says how and why).
GRPC_TOOLS ?= grpcio-tools==1.75.1
protos:
	rm -rf build/protoc-venv
	$(PYTHON) -m venv build/protoc-venv
	build/protoc-venv/bin/python -m pip install -q "$(GRPC_TOOLS)"
	build/protoc-venv/bin/python -m agent.node.protos.regenerate
	build/protoc-venv/bin/python agent/backends/tfserving_pb/regenerate.py
	rm -rf build/protoc-venv

# dist/edgeagent-VERSION.tar.gz and its wheel (built from the sdist, so the sdist is
# complete): `pip install dist/edgeagent-*.whl` on a box gets the agent
# (docs/operations.md, "Install"; tests/test_wheel.py installs it in a fresh venv).
# The build's own log (a line per file) goes to build/dist.log, shown when it fails.
# (DIST and DIST_LOG place them elsewhere: tests/test_wheel.py builds in a scratch folder.)
DIST ?= dist
DIST_LOG ?= build/dist.log
dist: | $(BIN)/python
	@$(BIN)/python -m pip install -q --disable-pip-version-check build
	@rm -rf $(DIST) && mkdir -p $(dir $(DIST_LOG))
	@echo "building the sdist and the wheel into $(DIST)/ (log: $(DIST_LOG))"
	@$(BIN)/python -m build --outdir $(DIST) . > $(DIST_LOG) 2>&1 \
	  || { tail -n 30 $(DIST_LOG); echo "make dist failed: $(DIST_LOG)"; exit 1; }
	@ls -1 $(DIST)

clean:
	rm -rf $(VENV) $(SCAN_VENV) build dist *.egg-info
