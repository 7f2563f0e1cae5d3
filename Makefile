# Feed the GPU. Two commands do everything on a fresh machine:
#   make run    install, execute every notebook headless, write the report of this machine
#   make test   install, lint, the fast unit tests, the benchmarks (smoke profile; 10 minutes)
SHELL   := /bin/bash
PYTHON  ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
PROFILE ?=
# Tests and notebooks run this many at a time in `make unit` and `make notebooks` (pytest-xdist;
# a notebook's cells stay together in one worker). Benchmarks always run alone.
TEST_JOBS ?= 2
STAMP   := $(VENV)/.installed
export PYTHONUNBUFFERED := 1
# No MPLBACKEND here: a Jupyter server or kernel that inherits Agg shows no plots. Unit tests
# choose Agg in tests/conftest.py; the benchmarks recipe sets it for itself.

.PHONY: install run test test-twice test-compat test-learner test-load test-doctor test-slow lint unit notebooks benchmarks bench reference lab kernel clean help

help:
	@echo "make run [PROFILE=smoke|full]  execute the suite into build/runs/<time>/, write build/report.html"
	@echo "make test                     lint + fast unit tests + benchmarks (smoke profile, ~10 min)"
	@echo "make notebooks                 every notebook through nbval, two at a time (smoke profile)"
	@echo "make test-slow                 the tests that start kernels, servers, ranks or workers (CI runs it)"
	@echo "make test-compat              unit tests + notebooks with the oldest supported torch (.venv-compat)"
	@echo "make test-learner             every notebook re-run, skipped and run as on Colab (CI runs it too)"
	@echo "make test-load                every notebook alone and beside one busy process, the thread collapse (CI runs it too)"
	@echo "make test-doctor              the doctor on whole scripts: its command line and its two bars (CI runs it too)"
	@echo "make bench                    the capstone benchmark (reference vs fast recipe)"
	@echo "make reference                on a GPU: full profile + bench, saved to results/reference/"
	@echo "make lab                      JupyterLab on the notebooks (loopback, token)"
	@echo "make kernel                   register this environment as a kernel for your own Jupyter"
	@echo "make clean                    remove executed copies, generated data and results"

# The environment is rebuilt only when the pins change; a second call starts in seconds.
$(STAMP): requirements.txt requirements-dev.txt requirements-nodeps.txt pyproject.toml scripts/install_d2l.py
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "Installing the pinned environment into $(VENV) (first time: about 2 minutes)..."
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements.txt -r requirements-dev.txt
	$(BIN)/python scripts/install_d2l.py
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	$(BIN)/python -m pip check
	@touch $@

install: $(STAMP)

# PROFILE=smoke|full|auto, else $$FTG_PROFILE, else auto (the run says which and why);
# CONFIRM=1 starts a full run on a machine without a GPU without asking.
run: install
	$(BIN)/python -m helpers.suite $(if $(PROFILE),--profile $(PROFILE)) $(if $(CONFIRM),--yes)

# The last line lints the scripts in %%writefile cells, which ruff skips in a notebook
# (`python scripts/lesson_scripts.py --fix` formats them in place).
lint: install
	$(BIN)/ruff format --check helpers tests notebooks benchmarks scripts
	$(BIN)/ruff check helpers tests notebooks benchmarks scripts
	$(BIN)/nbstripout --verify notebooks/*.ipynb
	$(BIN)/python scripts/lesson_scripts.py

unit: install
	FTG_PROFILE=smoke $(BIN)/python -m pytest tests -q -m "not learner and not load and not doctor and not slow" -n $(TEST_JOBS)

# The tests that start kernels, servers, ranks or DataLoader workers (seconds each: marked
# `slow`; not in `make test`, which they would push past its 10 minutes; .ci/run calls it).
test-slow: install
	FTG_PROFILE=smoke $(BIN)/python -m pytest tests -q -m "slow and not learner and not load and not doctor" -n $(TEST_JOBS)

# Every notebook as a learner uses it (not in `make test`; .ci/run calls it): every notebook in
# JupyterLab + headless Chromium (the browser test), whose kernel first runs it with the Explore
# sections skipped, so Run All is the re-run (tests/learner_passes.py; with nbclient where
# Chromium is missing); each Explore that needs no section above right after the setup;
# notebooks 00 and 07 the way Colab/Kaggle run them, from an empty folder, and every notebook's
# imports that way. The passes assert no speed, so they run TEST_JOBS at a time like
# `make notebooks` (a notebook beside another is what a shared class machine does to it);
# the hosted-style runs share one fresh environment, so they stay in one worker (xdist_group).
test-learner: install
	FTG_PROFILE=smoke $(BIN)/python -m pytest tests -q -m learner -n $(TEST_JOBS) --dist loadgroup

# Every notebook alone (its smoke budget), then, where the run alone kept more than one core
# busy (threads, workers, ranks: measured), beside one busy process: slower, never stalled
# (about 10 minutes on 2 cores; needs the machine otherwise quiet, so not in `make test`;
# .ci/run calls it); and the collapse of threads past the free cores beside a busy process, as
# a ratio (benchmarks/), and the capstone's input-pipeline ratio, read from its run alone here
# (benchmarks/test_capstone_ratio.py; `make bench` runs the capstone for it instead).
ALONE_RESULTS := $(abspath $(or $(FTG_BUILD_DIR),build)/load-alone)
test-load: install
	rm -rf $(ALONE_RESULTS)
	FTG_ALONE_RESULTS=$(ALONE_RESULTS) FTG_PROFILE=smoke $(BIN)/python -m pytest \
	    tests/test_under_load.py benchmarks/test_oversubscription.py \
	    benchmarks/test_capstone_ratio.py -q -s -m load

benchmarks: install   # speed ratios (never absolute times): run on a quiet machine
	MPLBACKEND=Agg FTG_PROFILE=smoke $(BIN)/python -m pytest benchmarks -q -m "not load and not learner and not doctor"

# The doctor on whole scripts and loops (not in `make test`; .ci/run calls it): its command line
# on scripts it did not write and the corpus of scripts in the styles users write
# (tests/doctor_corpus/), TEST_JOBS at a time (a diagnosis must hold on a shared machine; they
# assert no speed); then its bars (prediction vs re-run, its own cost), which are speed ratios
# and run alone like the benchmarks. About 5 minutes on the 2-core machine.
test-doctor: install
	MPLBACKEND=Agg FTG_PROFILE=smoke $(BIN)/python -m pytest tests -q -m doctor -n $(TEST_JOBS)
	MPLBACKEND=Agg FTG_PROFILE=smoke $(BIN)/python -m pytest benchmarks -q -m doctor

notebooks: install
	FTG_PROFILE=smoke $(BIN)/python -m pytest -q --nbval-lax --nbval-current-env \
	    --nbval-cell-timeout=300 -p tests.nbval_budget -n $(TEST_JOBS) --dist loadfile notebooks

# Every part runs even when an earlier one fails, so one report shows everything; the exit
# status is non-zero if any part failed. The notebooks (`make notebooks`), the slow tests
# (`make test-slow`) and the passes below are their own targets: with them `make test` took 16
# minutes; .ci/run calls them all (its run of each notebook alone is `make notebooks`'s check).
test: install
	@failed=""; \
	for part in lint unit benchmarks; do \
	    echo "=== make $$part"; \
	    $(MAKE) --no-print-directory $$part || failed="$$failed $$part"; \
	done; \
	if [ -n "$$failed" ]; then echo "make test: FAILED:$$failed"; exit 1; fi; \
	echo "make test: all parts passed"

test-twice: install   # every notebook run twice in one checkout: same results, no leftover state
	FTG_RUN_TWICE=1 $(BIN)/python -m pytest -q tests/test_run_twice.py

# The oldest supported versions (the lower bounds in pyproject.toml, pinned in
# requirements-compat.txt) in a second environment; unit tests and notebooks run there.
COMPAT       ?= .venv-compat
COMPAT_STAMP := $(COMPAT)/.installed
$(COMPAT_STAMP): requirements-compat.txt requirements-dev.txt requirements-nodeps.txt pyproject.toml scripts/install_d2l.py
	@test -x $(COMPAT)/bin/python || $(PYTHON) -m venv $(COMPAT)
	@echo "Installing the oldest supported versions into $(COMPAT) (first time: several minutes, torch is downloaded)..."
	$(COMPAT)/bin/python -m pip install -q --disable-pip-version-check -r requirements-compat.txt -r requirements-dev.txt
	$(COMPAT)/bin/python scripts/install_d2l.py
	$(COMPAT)/bin/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	$(COMPAT)/bin/python -m pip check
	@touch $@

test-compat: $(COMPAT_STAMP)
	$(COMPAT)/bin/python -c "import torch, torchvision; print('compat: torch', torch.__version__, 'torchvision', torchvision.__version__)"
	@# the browser test and the hosted-style runs test the packaging, not the torch version: `make test` has them
	FTG_PROFILE=smoke $(COMPAT)/bin/python -m pytest tests -q -m "not benchmark and not learner and not load" --ignore=tests/test_browser.py \
	    -k "not test_notebook_runs_from_an_empty_folder" -n $(TEST_JOBS)
	FTG_PROFILE=smoke $(COMPAT)/bin/python -m pytest -q --nbval-lax --nbval-current-env \
	    --nbval-cell-timeout=300 -p tests.nbval_budget -n $(TEST_JOBS) --dist loadfile notebooks

bench: install
	$(BIN)/python -m benchmarks.capstone

# On a GPU: the full profile and the benchmark, saved under results/reference/<date>_<gpu>/
# (commit that folder: every report shows it beside the reader's own figures).
reference: install
	$(BIN)/python -m helpers.suite --profile full --save-reference
	$(BIN)/python -m benchmarks.capstone

# Loopback, token, no news pop-up, --allow-root only as root (containers): helpers/suite/lab.py.
lab: install
	$(BIN)/python -m helpers.suite.lab notebooks

# A named kernel in the user's Jupyter data dir (--user, not --sys-prefix: a kernel inside this
# venv would be seen only by this venv's own Jupyter, not by the learner's JupyterLab or VS Code).
kernel: install
	@v=$$($(BIN)/python -c "from importlib.metadata import version; print(version('torch'))"); \
	$(BIN)/python -m ipykernel install --user --name feed-the-gpu --display-name "Feed the GPU (torch $$v)"

clean:
	rm -rf build
	find data -mindepth 1 ! -name README.md -exec rm -rf {} +
	find . -name __pycache__ -prune -not -path "./$(VENV)/*" -exec rm -rf {} +
