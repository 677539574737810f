# Fitting 70B — two commands: `make lab` and `make test`. Each does all of its own set-up.
SHELL := bash
.SHELLFLAGS := -eo pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
LAB_ARGS ?=
PYTEST_ARGS ?=
# The slowest tests and notebook cells of each tier, printed at its end (to keep the suite's time in view).
DURATIONS ?= --durations=25 --durations-min=5
# Quiet pip, minus the per-package notes some machines' pip configs print.
PIP_QUIET := 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }

export TORCH_EXTENSIONS_DIR := $(CURDIR)/.cache/torch_extensions
export PIP_DISABLE_PIP_VERSION_CHECK := 1
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: help setup lab test test-unit test-unit-early test-unit-late test-notebooks test-browser test-chapter gpu-check site labs bench clean

help:
	@echo "make lab    set up .venv and the DeepSpeed ops, then open JupyterLab on 00_setup"
	@echo "make test   set up, then run every test tier (unit, notebooks, browser)"
	@echo "            one tier: make test-unit | test-notebooks | test-browser | gpu-check"
	@echo "            one chapter: make test-chapter CH=02 (its tests, notebook and lab)"
	@echo "make site   the executed notebooks as an offline HTML book in .cache/site (index.html)"
	@echo "make gpu-check  every GPU item (gpu tests, experiments, notebooks' CUDA branches) -> results/gpu/"

$(STAMP): env/requirements.txt pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is needed, found " + sys.version.split()[0]'
	@echo "== creating $(VENV) with $(PYTHON) and installing env/requirements.txt (about 2 min the first time)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r env/requirements.txt $(PIP_QUIET)
	$(PY) -m pip install -q --no-deps -e . $(PIP_QUIET)
	touch $(STAMP)

setup: $(STAMP)
	@$(PY) -m gpumem.runs.dsops prepare

# Rooted at the repository, so the file browser reaches notebooks/, labs/ and solutions/;
# the path argument opens 00_setup (relative to the root) in the browser.
# JupyterLab's settings overrides: no "news" prompt on first open, no update check (nothing fetched).
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.json
$(LAB_OVERRIDES): env/jupyterlab_overrides.json $(STAMP)
	@mkdir -p $(dir $@) && cp env/jupyterlab_overrides.json $@

lab: setup $(LAB_OVERRIDES)
	$(VENV)/bin/jupyter lab --ServerApp.root_dir="$(CURDIR)" notebooks/00_setup.ipynb $(ROOT_FLAG) $(LAB_ARGS)

# Every tier runs even when an earlier one fails; the target fails if any did. Two streams share
# the two cores (one alone leaves about a third of them idle): the unit tests of test_00 .. test_labs*
# in front, and behind them the notebook tier, the browser tier and the rest of the unit tests
# (test_launch* .. test_timing*), in separate processes, temp folders and ports; the second stream's
# output is held in files and printed when the first is done. TIERS_IN_SERIES=1: one after the other.
# The formula-against-trace test runs last in the first stream: its two worker processes then use
# the core that the second stream, done by then, leaves idle (in front they crowd both streams).
UNIT_LATE := $(sort $(filter-out tests/test_lab%,$(wildcard tests/test_l*.py tests/test_[m-z]*.py)))
UNIT_LAST := tests/test_01_formula_vs_trace.py
UNIT_EARLY := $(sort $(filter-out $(UNIT_LATE) $(UNIT_LAST),$(wildcard tests/test_*.py))) $(UNIT_LAST)
BG_LOGS := .cache/test-notebooks.log .cache/test-browser.log .cache/test-unit-late.log
test: setup
	@status=0; mkdir -p .cache; rm -f $(BG_LOGS) $(addsuffix .rc,$(BG_LOGS)); \
	if [ -n "$(TIERS_IN_SERIES)" ]; then \
	  $(MAKE) --no-print-directory test-unit || status=1; \
	  $(MAKE) --no-print-directory test-notebooks || status=1; \
	  $(MAKE) --no-print-directory test-browser || status=1; \
	else \
	  echo "== two streams: unit tests test_00 .. test_labs*; beside them the notebook tier, the browser"; \
	  echo "   tier and the other unit tests (their output follows)"; \
	  { for t in notebooks browser unit-late; do log=.cache/test-$$t.log; \
	      $(MAKE) --no-print-directory test-$$t > $$log 2>&1 && echo 0 > $$log.rc || echo 1 > $$log.rc; \
	    done; } & bg=$$!; \
	  $(MAKE) --no-print-directory test-unit-early || status=1; \
	  wait $$bg || true; \
	  for log in $(BG_LOGS); do cat $$log; [ "$$(cat $$log.rc 2>/dev/null)" = 0 ] || status=1; done; \
	fi; \
	exit $$status

# In four processes, one after the other: one pytest process for all of them grew past the machine's
# 24 GB by the lab tests (a fresh clone's run was killed by the kernel's OOM killer, 2026-12-05).
UNIT_EARLY_LABS_A := $(filter tests/test_lab0% tests/test_lab_%,$(filter-out tests/test_lab05% tests/test_lab06% tests/test_lab08%,$(UNIT_EARLY)))
UNIT_EARLY_LABS_B := $(filter tests/test_lab%,$(filter-out $(UNIT_EARLY_LABS_A),$(UNIT_EARLY)))
UNIT_EARLY_REST := $(filter-out $(UNIT_EARLY_LABS_A) $(UNIT_EARLY_LABS_B) $(UNIT_LAST),$(UNIT_EARLY))
test-unit-early: setup
	@echo "== tier: unit, lab and quiz tests (test_00 .. test_labs*)"
	@st=0; for group in "$(UNIT_EARLY_REST)" "$(UNIT_EARLY_LABS_A)" "$(UNIT_EARLY_LABS_B)" "$(UNIT_LAST)"; do \
	  echo "$(PY) -m pytest -m \"not browser and not gpu\" $(DURATIONS) $(PYTEST_ARGS) $$group"; \
	  $(PY) -m pytest -m "not browser and not gpu" $(DURATIONS) $(PYTEST_ARGS) $$group || st=1; \
	done; exit $$st

test-unit-late: setup
	@echo "== tier: unit tests (test_launch* .. test_timing*)"
	$(PY) -m pytest -m "not browser and not gpu" $(DURATIONS) $(PYTEST_ARGS) $(UNIT_LATE)

test-unit: setup
	@echo "== tier: unit, lab and quiz tests"
	$(PY) -m pytest -m "not browser and not gpu" $(DURATIONS) $(PYTEST_ARGS)

# A temp folder of its own: a run someone killed on this machine leaves a folder in /tmp that the
# next run sweeps with a note on stderr, which nbval would read as a changed output.
test-notebooks: setup
	@echo "== tier: notebooks under nbval (--nbval-lax; checked cells compared)"
	@rm -rf .cache/test-tmp && mkdir -p .cache/test-tmp
	GPUMEM_QUIZ_MODE=text GPUMEM_QUIZ_SEED=0 GPUMEM_HOME=$(CURDIR)/.cache/test-home MPLBACKEND=Agg \
	  TMPDIR=$(CURDIR)/.cache/test-tmp \
	  $(PY) -m pytest --nbval-lax --nbval-current-env -p no:cacheprovider notebooks solutions $(DURATIONS) $(PYTEST_ARGS)

# One chapter: its tests, its notebook and its lab's solution under nbval.
test-chapter: setup
	@test -n "$(CH)" || { echo "usage: make test-chapter CH=02"; exit 2; }
	$(PY) -m pytest -m "not browser and not gpu" $(wildcard tests/test_$(CH)_*.py) $(PYTEST_ARGS)
	@rm -rf .cache/test-tmp && mkdir -p .cache/test-tmp
	GPUMEM_QUIZ_MODE=text GPUMEM_QUIZ_SEED=0 GPUMEM_HOME=$(CURDIR)/.cache/test-home MPLBACKEND=Agg \
	  TMPDIR=$(CURDIR)/.cache/test-tmp $(PY) -m pytest --nbval-lax --nbval-current-env -p no:cacheprovider \
	  $(wildcard notebooks/$(CH)_*.ipynb solutions/lab$(CH)_*.ipynb) $(PYTEST_ARGS)

test-browser: setup $(LAB_OVERRIDES)
	@echo "== tier: JupyterLab in headless Chromium"
	$(PY) -m pytest -m browser -rs $(PYTEST_ARGS)

# Every gpu-marked test (measurements collected), each experiment with --device cuda and each
# notebook's CUDA branches; on CUDA writes results/gpu/<date>_<gpu>.json + .md (commit them).
# Without CUDA: every item reported skipped with its reason, nothing written, exit 0.
GPU_CHECK_ARGS ?=
gpu-check: setup
	$(PY) tools/gpu_check.py $(GPU_CHECK_ARGS) $(if $(PYTEST_ARGS),-- $(PYTEST_ARGS),)

# The executed notebooks as an offline book (Sphinx + MyST-NB, nothing re-run, nothing fetched;
# quizzes answered in the browser); SITE_DIR=... to put it elsewhere.
SITE_DIR ?= .cache/site
site: $(STAMP)
	$(PY) tools/build_site.py --out "$(SITE_DIR)"

labs: setup
	$(PY) -m gpumem.course.labgen

clean:
	rm -rf $(VENV) .cache

bench: setup
	$(PY) -m gpumem.memory.bench
