PY := .venv/bin/python
PIP := .venv/bin/pip
DEMO_DIR := demo_out

.PHONY: venv demo test test-all bench lint format clean

.venv/installed: pyproject.toml
	python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e ".[dev,torch,scale,parity,gcs]"
	touch .venv/installed

venv: .venv/installed

demo: venv
	$(PY) -m launch.demo --output $(DEMO_DIR)

test: venv
	$(PY) -m pytest -q -n 2 --dist loadgroup tests

test-all: venv
	$(PY) -m pytest -q -n 2 --dist loadgroup -m "" tests

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
