# The two commands: `make run` and `make test`. Each creates .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,bench,tfserving]'
	touch $(STAMP)

run: $(STAMP)
	@echo "Starting the node agent on the embedded demo. Query it from another shell:"
	@echo "  curl -s http://127.0.0.1:8000/v1/models/classifier:predict -d '{\"instances\": [[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]]}'"
	@echo "  $(BIN)/edgeagent cache ls"
	$(BIN)/edgeagent serve

test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) build *.egg-info
