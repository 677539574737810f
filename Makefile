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

# Every group runs even when an earlier one fails; the target fails if any did. The tests are cut into
# groups, each a target below run in its own process, temp folder and ports: tools/run_tiers.py runs
# them two at a time (one alone leaves a core idle), in the order listed, and prints each group's output
# whole when it ends. Their order keeps both cores busy to the end (minutes each took beside another
# on 2 cores, a fresh clone, 2026-12-06: notebooks 8, labs A 11, labs B 9, late unit 6, unit A 4,
# unit B 5, formula 3, browser 2; all 8 in 24:15, set-up 5:50). The formula-against-trace test's two
# worker processes come last, beside the browser tier. TIERS_IN_SERIES=1: one group at a time.
UNIT_LATE := $(sort $(filter-out tests/test_lab%,$(wildcard tests/test_l*.py tests/test_[m-z]*.py)))
UNIT_LAST := tests/test_01_formula_vs_trace.py
UNIT_EARLY := $(sort $(filter-out $(UNIT_LATE) $(UNIT_LAST),$(wildcard tests/test_*.py))) $(UNIT_LAST)
# Lab tests in two processes: one pytest process for all of the early unit tests grew past the
# machine's 24 GB by the lab tests (a fresh clone's run was killed by the kernel's OOM killer, 2026-12-05).
UNIT_EARLY_LABS_A := $(filter tests/test_lab0% tests/test_lab_%,$(filter-out tests/test_lab05% tests/test_lab06% tests/test_lab08%,$(UNIT_EARLY)))
UNIT_EARLY_LABS_B := $(filter tests/test_lab%,$(filter-out $(UNIT_EARLY_LABS_A),$(UNIT_EARLY)))
UNIT_EARLY_REST := $(filter-out $(UNIT_EARLY_LABS_A) $(UNIT_EARLY_LABS_B) $(UNIT_LAST),$(UNIT_EARLY))
UNIT_REST_A := $(filter tests/test_00% tests/test_01% tests/test_02% tests/test_03%,$(UNIT_EARLY_REST))
UNIT_REST_B := $(filter-out $(UNIT_REST_A),$(UNIT_EARLY_REST))
TEST_GROUPS := test-notebooks test-labs-a test-labs-b test-unit-late test-unit-a test-unit-b test-formula test-browser
UNIT_RUN = $(PY) -m pytest -m "not browser and not gpu" $(DURATIONS) $(PYTEST_ARGS)

test: setup $(LAB_OVERRIDES)
	@$(PY) tools/run_tiers.py $(if $(TIERS_IN_SERIES),1,2) $(TEST_GROUPS)

test-unit-a: setup
	@echo "== unit tests of chapters 00-03"
	$(UNIT_RUN) $(UNIT_REST_A)

test-unit-b: setup
	@echo "== unit tests of chapters 04-08 and test_b* .. test_hf*"
	$(UNIT_RUN) $(UNIT_REST_B)

test-labs-a: setup
	@echo "== lab tests: labs 01-04 and the labs' shared guards"
	$(UNIT_RUN) $(UNIT_EARLY_LABS_A)

test-labs-b: setup
	@echo "== lab tests: labs 05, 06, 08 and test_labs*"
	$(UNIT_RUN) $(UNIT_EARLY_LABS_B)

test-formula: setup
	@echo "== chapter 01's formula against fake-tensor traces of every registry model"
	$(UNIT_RUN) $(UNIT_LAST)

test-unit-early: test-unit-a test-unit-b test-labs-a test-labs-b test-formula

test-unit-late: setup
	@echo "== tier: unit tests (test_launch* .. test_timing*)"
	$(UNIT_RUN) $(UNIT_LATE)

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
