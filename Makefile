# make demo: set up, get the data, train the default recipe.  make test: set up, run the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-as test-machines lint reference bench bench-guard bench-peers bench-gan setup data clean

setup: $(STAMP)

# torch first, pinned: the local CPU wheel; a bare `torch` requirement would pull a multi-GB CUDA build
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev,onnx]'
	touch $(STAMP)

# the official download first (per the resolution order); on a Debian machine without internet, its package
data: $(STAMP)
	@$(BIN)/hasten data fetch fashion-mnist || { \
	  command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
	  echo "trying Debian's dataset-fashion-mnist package" && \
	  apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist >/dev/null && \
	  $(BIN)/hasten data fetch fashion-mnist; }

demo: data
	$(BIN)/hasten train fashion-fast run.overwrite=true  # a second demo moves the first one aside (runs/fashion-fast/replaced-*)

# the tests run single-threaded (tests/conftest.py), so one worker per CPU (pytest-xdist; an idle worker takes tests
# queued for another, as a few take a minute each): on 2 cores the suite takes half the time; TEST_WORKERS=0 runs
# it in this one process (a debugger, -x, ordered output)
TEST_WORKERS ?= auto
WORKERS := -n $(TEST_WORKERS) --dist worksteal
test: $(STAMP)
	$(BIN)/python -m pytest -q $(WORKERS)

# the suite as another CPU runs it: CPU=avx2 (an AVX2-only CPU), avx512-bf16 (an AMD Zen 4), avx512, sse41, or
# below (the largest kernel set under this machine's own); a cap only imitates a smaller CPU than this one
# (tests/cpu_kernels.py). PYTEST_ARGS="-m numerics" runs the accuracy-sensitive tests alone.
CPU ?= below
test-as: $(STAMP)
	@kernels=$$($(BIN)/python tests/cpu_kernels.py $(CPU)) && echo "kernels: $$kernels" && \
	  env $$kernels $(BIN)/python -m pytest -q $(WORKERS) $(PYTEST_ARGS)

# the tests of hasten's machine decisions (marked machine) under each HASTEN_MACHINE profile: the decisions an AVX2
# CPU, a Zen 4, an AMX Xeon or a GPU server would make, on this machine (docs/development.md); the other profiles'
# (avx512, cuda-fp16, sse41) decisions are checked in every run by tests/test_machine.py's table. ~35 s a profile on a
# Zen 4, ~65 s on a 2-core AVX2 EPYC (two workers)
PROFILES ?= avx2 avx512-bf16 amx cuda
test-machines: $(STAMP)
	@for profile in $(PROFILES); do echo "HASTEN_MACHINE=$$profile"; \
	  HASTEN_MACHINE=$$profile $(BIN)/python -m pytest -q $(WORKERS) -m machine $(PYTEST_ARGS) || exit 1; done

# ruff, then the import contract in pyproject.toml (the layers of docs/architecture.md, no import circles)
lint: $(STAMP)
	$(BIN)/ruff check hasten tests benchmarks
	$(BIN)/ruff format --check hasten tests benchmarks
	$(BIN)/lint-imports

# docs/reference.md (the recipe keys, from the schema) and docs/techniques.md (from the technique registry);
# tests/recipe/test_reference.py and tests/techniques/test_registry.py fail when either is stale
reference: $(STAMP)
	$(BIN)/python -m hasten.recipe.reference docs/reference.md
	$(BIN)/python -m hasten.techniques.docs docs/techniques.md

# every benchmark, one after another (each measures its variants side by side in one run); on 2 CPU cores this
# takes several hours (benchmarks/speed.py alone about two). Each script's docstring says what it measures;
# results land in bench/.
bench: data
	$(BIN)/python benchmarks/precision.py
	$(BIN)/python benchmarks/tricks.py
	$(BIN)/python benchmarks/imagefolder.py
	$(BIN)/python benchmarks/gan.py
	$(BIN)/python benchmarks/distributed.py
	$(BIN)/hasten bench fashion-fast --repeats 3
	$(BIN)/python benchmarks/generalization.py
	$(BIN)/python benchmarks/speed.py headline
	$(BIN)/python benchmarks/speed.py headline94 --repeats 1
	$(BIN)/python benchmarks/speed.py auto
	$(BIN)/python benchmarks/speed.py widths
	$(BIN)/python benchmarks/speed.py ablations --repeats 1
	$(BIN)/python benchmarks/speed.py seeds
	$(BIN)/python benchmarks/speed.py report

# the regression guard: the headline recipe and one folder run, each alternated with commit BEFORE in one sitting, on
# whatever CPU this is (the reports name its kind); run it before merging a change to training
BEFORE ?= 28eda3d
bench-guard: data
	$(BIN)/python -c "from benchmarks import datasets; datasets.ensure('letters', 'bench/data/letters')"
	$(BIN)/python benchmarks/wallclock.py --before $(BEFORE) --out bench/guard/headline.md
	$(BIN)/python benchmarks/wallclock.py --before $(BEFORE) --recipe seed-cnn-32 --out bench/guard/folder.md \
		--thresholds 0.25,0.3 data.root=bench/data/letters

# hasten beside PyTorch Lightning on the same recipe (benchmarks/peers/); the extra is installed only here, with
# the torch already in the venv named as a requirement so pip keeps it. PEERS_ARGS, e.g. "--repeats 1", is passed on
PEERS := $(VENV)/.peers-installed
$(PEERS): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[peers]' \
	  "torch==$$($(BIN)/python -c 'import torch; print(torch.__version__.split("+")[0])')"
	touch $(PEERS)

bench-peers: data $(PEERS)
	$(BIN)/python benchmarks/peers/lightning_fashion.py fashion-fast $(PEERS_ARGS)

# the DCGAN in fp32, bf16 and fp16 on the same budget (docs/gan.md); GAN_ARGS, e.g. "--quick", is passed on
bench-gan: data
	$(BIN)/python benchmarks/gan.py $(GAN_ARGS)

clean:
	rm -rf $(VENV) runs bench .pytest_cache
