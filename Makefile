# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed

.PHONY: demo test venv bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/torchfl kernels warmup
	$(VENV)/bin/torchfl demo

test: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadgroup -q

bench: $(STAMP)
	$(PY) tools/bench_cli.py

clean:
	rm -rf $(VENV) .cache build dist
