# nsa-run set-up and everyday commands. Everything lives in .venv inside the checkout.
#
#   make test      create .venv if needed, install, run the test suite
#   make oneshot   create .venv if needed, install, run every stage (ARGS="--only sanity" etc.)
#   make lint      ruff
#
# The venv is created with --system-site-packages so a torch that is already installed (the CUDA
# build on a GPU pod) is reused and never replaced. Only when the venv cannot import torch is a
# CPU wheel installed (the PyTorch CPU index; never the multi-GB CUDA wheels on a CPU machine).
# Installation is stamped: the second `make test` only runs the tests (pyproject.toml changes,
# e.g. a new stage entry point, re-install).

PYTHON ?= python3
VENV ?= .venv
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
ARGS ?=
# the suite runs on every core, at most 4 (pytest-xdist; most tests wait on nsa-run processes they start): about
# half the time on CI's 2-core machine. --durations names the slowest tests, which keep it within CI's time.
PYTEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ "$$n" -gt 4 ] && n=4; echo $$n)
PYTEST_ARGS ?= -q -ra -n $(PYTEST_JOBS) --durations=25

PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.nsa-run-installed

.DEFAULT_GOAL := help
.PHONY: help install test oneshot lint clean-venv mutate

help:
	@echo "make test      install into $(VENV) (once) and run pytest"
	@echo "make oneshot   install into $(VENV) (once) and run nsa-run oneshot \$$ARGS"
	@echo "make lint      ruff check"
	@echo "make mutate    mutation testing (mutmut; not in CI, see docs/testing.md)"
	@echo "make install   only create/update $(VENV)"

$(PY):
	$(PYTHON) -m venv --system-site-packages $(VENV)

$(STAMP): pyproject.toml | $(PY)
	@if $(PY) -c "import torch" 2>/dev/null; then \
		echo "torch $$($(PY) -c 'import torch; print(torch.__version__)') already installed: reused, not replaced"; \
	else \
		echo "no torch in $(VENV): installing a CPU wheel from $(TORCH_CPU_INDEX)"; \
		$(PIP) install --timeout 60 --retries 1 --index-url $(TORCH_CPU_INDEX) torch || { \
			echo "error: could not install a CPU torch. Install torch into $(VENV) yourself" \
			     "(e.g. $(PIP) install torch) and run make again." >&2; exit 1; }; \
	fi
	$(PIP) install -q -e '.[dev,triton]'
	@$(PY) -c "import torch, nsa_runner; print('ready: torch', torch.__version__, '| nsa-run', nsa_runner.__version__)"
	@touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	@$(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests (exit 5): nothing was verified" >&2; exit 1; fi; \
	exit $$rc

# GNU make exits 2 whenever a recipe fails, whatever the recipe's own code. The recipe therefore
# names nsa-run's own exit code (1 = a check failed, 2 = usage or environment, 130 = interrupted)
# on its last line, and the run's manifest.json records it as "exit_code"; .ci/run checks both.
# For the exact code as the process status, call the CLI directly: .venv/bin/nsa-run oneshot.
oneshot: $(STAMP)
	@$(VENV)/bin/nsa-run oneshot $(ARGS); rc=$$?; \
	if [ $$rc -ne 0 ]; then \
		echo "make oneshot: nsa-run exited $$rc (1 = a check failed, 2 = usage or environment, 130 = interrupted;" \
		     "make itself reports any failure as 2)" >&2; \
	fi; \
	exit $$rc

lint: $(STAMP)
	$(PY) -m ruff check .

clean-venv:
	rm -rf $(VENV)

# Mutation testing (mutmut, config in pyproject.toml [tool.mutmut]); not in CI. Results and the
# surviving mutants of the last run: docs/testing.md. MUTANTS picks mutants by name (globs); the
# default is the time-boxed set (under 20 min on 2 shared cores); MUTANTS= runs every mutant.
# Resumable: mutants already checked are skipped (rm -rf mutants/ to start over).
MUTANTS ?= 'nsa_core.selection.reference.x_topn_blocks*' 'nsa_runner.executor.x__apply_result*'
mutate: $(STAMP)
	@$(PY) -c "import mutmut" 2>/dev/null || $(PIP) install -q -e '.[mutate]'
	OMP_NUM_THREADS=1 $(VENV)/bin/mutmut run --max-children 2 $(MUTANTS); \
	$(VENV)/bin/mutmut results | grep -v ': not checked$$'
