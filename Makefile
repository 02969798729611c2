# Two commands that work on a fresh machine: `make train` and `make test`.
# Each creates .venv when it is missing and (re)installs the project only
# when setup.py changed since the last install.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
export TF_CPP_MIN_LOG_LEVEL := 3

.PHONY: train lint test test-slow venv clean

venv: $(STAMP)

# uv installs the project in a fraction of pip's time (a fresh clone's venv: 165 s through
# pip, 26-50 s through uv). It reads no pip.conf: it takes PyPI, where pip found every
# version it chose here, the system's CA certificates, and pip's 180 s network timeout.
# It compiles the bytecode at install as pip does: where PYTHONDONTWRITEBYTECODE is set
# (as here), every process would otherwise compile TensorFlow's sources at each import.
# The venv's pip is upgraded too, for the scripts and tests that build wheels and peer
# venvs with it.
UV_ENV := UV_NATIVE_TLS=1 UV_HTTP_TIMEOUT=180 UV_COMPILE_BYTECODE=1
$(STAMP): setup.py
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q uv
	$(UV_ENV) $(VENV)/bin/uv pip install -q --python $(VENV)/bin/python \
		--upgrade-package pip -e '.[dev,bench]' pip
	touch $(STAMP)

RUN_DIR ?= runs/cartpole-ppo-$(shell date +%Y%m%d-%H%M%S)

train: $(STAMP)
	$(VENV)/bin/policy-service train ppo --env CartPole-v1 \
		--config algorithms/tuned/cartpole_ppo.yaml --num-gpus 2 --fake-gpus \
		--stop-reward 450 --stop-timesteps 300000 --output-dir $(RUN_DIR)

# Style and types are the tools' job (settings in pyproject.toml); `make test`
# runs this first, so CI fails on a lint, format or type error before the suite starts.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy policy_service algorithms

# pytest exits 5 when it collected nothing; make would report that as a plain 2,
# so it is turned into a failure with a reason here: a suite that runs nothing checks nothing.
PYTEST = $(VENV)/bin/python -m pytest -q
RUN_TESTS = rc=0; $(PYTEST) -m "$(1)" $(2) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest -m '$(1)' collected no tests" >&2; exit 1; fi; exit $$rc

# The suite without the slow group (learning runs, benchmark smoke runs, the
# RLlib differential test), in two worker processes, a test file per worker at a
# time (so a module's Ray and built policies are made once), the costliest file left
# first (tests/conftest.py, from the seconds every run records), the 25 slowest tests
# reported to keep the budget in view (8 minutes quiet, 12 beside a CPU-bound job);
# CI runs both groups.
TEST_WORKERS ?= 2
test: $(STAMP) lint
	@$(call RUN_TESTS,not slow,-n $(TEST_WORKERS) --dist loadfile --durations 25)

# The slow group the same way: its files' minutes of learning and child processes
# overlap on the two cores, the longest first so that none runs alone at the end; the
# peers' virtualenvs are built once per machine (tests/benchmark_runs.py). CI's budget
# for both groups: 45 minutes.
test-slow: $(STAMP)
	@$(call RUN_TESTS,slow,-n $(TEST_WORKERS) --dist loadfile --durations 40)

clean:
	rm -rf $(VENV) runs
