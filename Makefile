# The two commands of the README: `make run` and `make test` (plus `make ui`).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The C kernels of deduplication, built again when their source changes (without a compiler the
# build is skipped and numpy's versions run: ito_assets/data/kernels.py).
KERNELS := $(VENV)/.kernels
export DAGSTER_HOME ?= $(CURDIR)/.ito/dagster

.PHONY: run ui test test-long mutation bootstrap clean

bootstrap: $(KERNELS)

# torch is installed first and exactly: 2.13.0 is the CPU build on this machine's disk;
# an open range could resolve to a multi-GB CUDA wheel.
# The installers' own output (setuptools' warnings among it) goes to a log, shown only on failure.
$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	@echo "installing the project into $(VENV) (log: $(VENV)/bootstrap.log)"
	@{ $(BIN)/pip install --quiet --upgrade pip && \
	   $(BIN)/pip install --quiet "torch==2.13.0" && \
	   $(BIN)/pip install --quiet -e '.[dev,cluster,ft,ray]'; } > $(VENV)/bootstrap.log 2>&1 \
	   || { cat $(VENV)/bootstrap.log; exit 1; }
	touch $(STAMP)

$(KERNELS): $(STAMP) ito_assets/data/_kernels.c setup.py
	@# The extension is optional: a build that fails keeps no stale library, so numpy's versions run and say so.
	@rm -f ito_assets/data/_kernels.*.so
	@$(BIN)/pip install --verbose --no-deps --no-build-isolation -e . > $(VENV)/kernels.log 2>&1 || { cat $(VENV)/kernels.log; exit 1; }
	@$(BIN)/python -c "from ito_assets.data import kernels; print('deduplication kernels:', 'C' if kernels.NATIVE else 'numpy (the C build failed or no C compiler was found at install: .venv/kernels.log)')"
	touch $@

$(DAGSTER_HOME)/dagster.yaml:
	mkdir -p $(DAGSTER_HOME)
	cp deploy/local/dagster.yaml $@

run: $(KERNELS) $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/python -m ito_assets.local_run

ui: $(KERNELS) $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/dagster dev -w workspace.yaml

# Three pytest-xdist workers, handed a test file at a time with the slow ones first (tests/conftest.py),
# so the whole of `make run` on one worker overlaps everything else on the others, and a module's
# fixture (the layouts' training runs, a Ray cluster, a data chain) is built once (docs/testing.md).
# With one OpenMP thread per process (tests/conftest.py), a third worker fills the time the others
# spend waiting on launched workers, heartbeats and polls: 8.4 minutes against 11.8 on two, on two
# cores (docs/performance.md). WORKERS=0 runs in one process.
WORKERS ?= 3

# Byte-code is written even where the environment says not to (PYTHONDONTWRITEBYTECODE, set on
# this project's CI machines): the three test workers and every stage worker a test launches
# otherwise compile the project's modules, and pytest rewrites every test module, again each time
# (docs/performance.md); the project is compiled once before the workers start. __pycache__ is
# git-ignored.
test: $(KERNELS)
	@PYTHONDONTWRITEBYTECODE= $(BIN)/python -m compileall -q -j 0 ito_assets > /dev/null
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -n $(WORKERS) --dist loadfile --no-loadscope-reorder

# The long matrices (races of 16 and 64 callers, 20 trials each) and the property tests with many
# more examples; `make test` runs a short version of each.
test-long: $(KERNELS)
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q --run-long -m "long or fuzz"

# A benchmark, not a test: the mutation score of the modules that enforce promises (docs/testing.md).
mutation: $(KERNELS)
	$(BIN)/python benchmarks/mutation.py

clean:
	rm -rf .ito
