# Two commands set everything up on a fresh machine: `make demo` and `make test`.
# Each creates .venv when needed and installs only when setup.py changed (stamp files).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
# pytest-xdist workers for `make test`: one per core (auto); TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= auto
# Extras for the test environment; add torch to test the torch.export importer and the model-coverage
# suite too (make test EXTRAS=test,onnx,torch: what CI runs); without it those tests are skipped.
EXTRAS ?= test,onnx
comma := ,
TEST_STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: demo lint test test-all test-models clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: setup.py $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(TEST_STAMP): setup.py $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]"
	touch $@

demo: $(VENV)/.installed
	$(BIN)/diviml demo

# The formatter's check and the linter (ruff.toml), both with zero findings; `make test` runs it first.
lint: $(TEST_STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

# The whole suite, slow cases excluded, property tests on fixed examples, a test file per worker (its
# module fixtures built once); `make test-all` includes the slow cases and draws fresh examples, five
# times as many (HYPOTHESIS_PROFILE=thorough).
test: lint
	$(BIN)/python -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-all: $(TEST_STAMP)
	HYPOTHESIS_PROFILE=thorough $(BIN)/python -m pytest -q $(PYTEST_ARGS)

# The whole model-coverage catalogue (torchvision and Hugging Face models through torch.export and ONNX,
# needs EXTRAS with torch): what CI runs after `make test`. Its cases spread over the workers one by one
# (one file): 6 minutes on 2 cores, 11 in one process.
test-models: $(TEST_STAMP)
	$(BIN)/python -m pytest -q -m slow tests/app/test_coverage.py -n $(TEST_WORKERS) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
