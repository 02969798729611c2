# Two commands that work on a fresh machine: `make train` and `make test`.
# Each creates .venv when it is missing and (re)installs the project only
# when setup.py changed since the last install.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
export TF_CPP_MIN_LOG_LEVEL := 3

.PHONY: train test venv clean

venv: $(STAMP)

$(STAMP): setup.py
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev,bench]'
	touch $(STAMP)

RUN_DIR ?= runs/cartpole-ppo-$(shell date +%Y%m%d-%H%M%S)

train: $(STAMP)
	$(VENV)/bin/policy-service train ppo --env CartPole-v1 \
		--config algorithms/tuned/cartpole_ppo.yaml --num-gpus 2 --fake-gpus \
		--stop-reward 450 --stop-timesteps 300000 --output-dir $(RUN_DIR)

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q

clean:
	rm -rf $(VENV) runs
