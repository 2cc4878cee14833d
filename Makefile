# Two commands a newcomer needs: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test bench lint docs system-deps clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

install: $(STAMP)

demo: install
	$(VENV)/bin/truegpu demo

# Real Prometheus, promtool and Alertmanager for the tests (Debian packages).
system-deps:
	@missing=; \
	for b in prometheus promtool amtool; do command -v $$b >/dev/null || missing="$$missing $$b"; done; \
	command -v prometheus-alertmanager >/dev/null || command -v alertmanager >/dev/null || missing="$$missing alertmanager"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian prometheus + prometheus-alertmanager (missing:$$missing)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; \
	  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then SUDO=sudo; \
	  else echo "ERROR: need$$missing for the tests; run as root or: sudo apt-get install prometheus prometheus-alertmanager" >&2; exit 1; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq prometheus prometheus-alertmanager >/dev/null \
	    || { echo "ERROR: apt-get install prometheus prometheus-alertmanager failed" >&2; exit 1; }; \
	fi

lint: install
	$(VENV)/bin/ruff check .

test: install system-deps lint
	$(VENV)/bin/pytest

bench: install
	$(PY) bench/bench_simulator.py
	$(PY) bench/bench_exporter.py
	$(PY) bench/bench_sources.py
	$(PY) bench/bench_ingest.py
	$(PY) bench/bench_analyze.py

clean:
	rm -rf $(VENV) out truegpu-report .pytest_cache .ruff_cache

docs: install
	$(PY) -m exporter.schema_doc > docs/metrics.md
