# The README's two commands: `make demo` and `make test`. Both start from a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/drainpipe demo

test: install
	$(PY) -m pytest -q

bench: install
	$(PY) benchmarks/queue_throughput.py

clean:
	rm -rf $(VENV) .pytest_cache build src/*.egg-info
