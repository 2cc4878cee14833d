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

# checkov (tests/deploy's security scan) in a venv of its own: its pins would downgrade ours.
# Only `make test` needs it, not `make demo`.
CHECKOV := $(VENV)/checkov/.installed
$(CHECKOV): requirements/checkov.txt | $(STAMP)
	$(PYTHON) -m venv $(VENV)/checkov
	$(VENV)/checkov/bin/pip install -q -r requirements/checkov.txt
	touch $@

install: $(STAMP)

demo: install
	$(VENV)/bin/truegpu demo

# Real parts the tests start (Debian packages): Prometheus, promtool, Alertmanager, amtool,
# VictoriaMetrics (a second Prometheus-compatible engine), a PostgreSQL server (cost rollups),
# Chromium (the service's HTML page in a browser) and systemd-analyze (the exporter's unit file).
DEBIAN_TEST_PACKAGES := prometheus prometheus-alertmanager victoria-metrics postgresql chromium systemd
system-deps:
	@missing=; \
	for b in prometheus promtool amtool victoria-metrics chromium systemd-analyze; do command -v $$b >/dev/null || missing="$$missing $$b"; done; \
	command -v prometheus-alertmanager >/dev/null || command -v alertmanager >/dev/null || missing="$$missing alertmanager"; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian $(DEBIAN_TEST_PACKAGES) (missing:$$missing)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; \
	  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then SUDO=sudo; \
	  else echo "ERROR: need$$missing for the tests; run as root or: sudo apt-get install $(DEBIAN_TEST_PACKAGES)" >&2; exit 1; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $(DEBIAN_TEST_PACKAGES) >/dev/null \
	    || { echo "ERROR: apt-get install $(DEBIAN_TEST_PACKAGES) failed" >&2; exit 1; }; \
	fi

lint: install
	$(VENV)/bin/ruff check .

# One worker per logical CPU ("auto" would count physical cores where psutil is installed); a module's tests
# run on one worker (tests/conftest.py's scheduler).
test: install $(CHECKOV) system-deps lint
	$(VENV)/bin/pytest -n logical --dist loadscope

bench: install
	$(PY) bench/bench_simulator.py
	$(PY) bench/bench_exporter.py
	$(PY) bench/bench_sources.py
	$(PY) bench/bench_ingest.py
	$(PY) bench/bench_e2e.py
	$(PY) bench/bench_prometheus.py
	$(PY) bench/bench_shard.py --gpus 2048
	$(PY) bench/bench_serve.py --shard 0/4
	$(PY) bench/bench_analyze.py
	$(PY) bench/bench_report.py
	$(PY) bench/bench_rollups.py
	$(PY) bench/healthy_false_rate.py --replay-seeds 2

clean:
	rm -rf $(VENV) out truegpu-report .pytest_cache .ruff_cache

docs: install
	$(PY) -m exporter.schema_doc > docs/metrics.md
	$(PY) -m analyzer.detectors > docs/findings.md
