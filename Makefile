# exactlens: `make test` and `make report` each set themselves up on a fresh machine.
# Each environment is one pip command with the pinned CPU torch in it (an unpinned torch pulls GBs of CUDA
# packages); `make test` builds both environments and the browser at once (make -j3), then runs the suites.

PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
VENV_TL39 := .venv-tl39
PIP_FLAGS ?= --quiet --disable-pip-version-check
PYTEST_FLAGS ?= -q -p no:cacheprovider

.PHONY: setup setup-tl39 setup-browser test test-main test-tl39 test-slow report bench bench-readme lint clean

setup: $(VENV)/.installed
setup-tl39: $(VENV_TL39)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install $(PIP_FLAGS) $(TORCH) -e ".[dev,tracr,ray]"
	touch $@

# A second environment with TransformerLens 3.9.0 (HookedTransformer): exactlens installed normally (its
# dependencies too; TL 3.9 satisfies transformer-lens>=3.9,<5) for the exports and users' TL 3 models.
# Its dependencies install beside .venv's (make -j); exactlens itself only after .venv's is in (order-only), since
# each pip builds the package's metadata in src/ and two at once could collide.
$(VENV_TL39)/.deps: pyproject.toml
	$(PYTHON) -m venv $(VENV_TL39)
	$(VENV_TL39)/bin/pip install $(PIP_FLAGS) $(TORCH) "transformer-lens==3.9.0" pytest hypothesis scipy einops
	touch $@

$(VENV_TL39)/.installed: $(VENV_TL39)/.deps | $(VENV)/.installed
	$(VENV_TL39)/bin/pip install $(PIP_FLAGS) -e .
	touch $@

# The set-ups run side by side (pip is mostly one core, and waits on the disk), the suites one after the other.
test:
	$(MAKE) --no-print-directory -j3 setup setup-tl39 setup-browser
	$(MAKE) --no-print-directory test-main test-tl39

# Headless Chromium for the browser tests (tests/viz/test_browser.py), from Debian's
# packages where no Chromium is installed yet. Needs root (or password-less sudo);
# without it the browser tests skip locally and fail in CI (EXACTLENS_REQUIRE_BROWSER=1).
BROWSER_BINS := chromium-headless-shell chromium chromium-browser
setup-browser:
	@for b in $(BROWSER_BINS); do command -v $$b >/dev/null && exit 0; done; \
	sudo=""; [ "$$(id -u)" = 0 ] || sudo="sudo -n"; \
	echo "installing chromium-headless-shell (Debian) for the browser tests" >&2; \
	( $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium-headless-shell || \
	  ( $$sudo apt-get update -q && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium-headless-shell ) ) >/dev/null 2>&1 || \
	echo "could not install chromium-headless-shell: browser tests will skip (or fail in CI)" >&2

test-main: setup setup-browser
	$(VENV)/bin/python -m pytest $(PYTEST_FLAGS) -n 2 --dist loadgroup -m "not slow" --durations=20

test-tl39: setup-tl39
	$(VENV_TL39)/bin/python -m pytest $(PYTEST_FLAGS) -m "export or tl39" tests/model/test_export.py tests/model/test_tl_habits.py tests/interop/test_foreign.py

test-slow: setup
	$(VENV)/bin/python -m pytest $(PYTEST_FLAGS) -m slow

report: setup
	$(VENV)/bin/exactlens report --out report --overwrite

# Every benchmarks/bench_*.py (its own output as it runs), then one table of every measured number
# beside its goal, with the date and the load average, also written to bench-results.json.
# `make bench BENCH_FLAGS=--quick`: small settings, a smoke run of a few minutes.
# `make bench-readme`: the README's generated table (between its bench-table markers) from bench-results.json.
BENCH_RESULTS ?= bench-results.json
bench: setup
	$(VENV)/bin/python benchmarks/run_all.py $(BENCH_FLAGS) --results $(BENCH_RESULTS) --overwrite

bench-readme: setup
	$(VENV)/bin/python benchmarks/readme_table.py $(BENCH_RESULTS)

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) $(VENV_TL39) report
