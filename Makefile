# Two commands for a newcomer: `make bench` and `make test`. Both create .venv and install what they need.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Reinstall when pyproject.toml changes.
STAMP  := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-10)

.PHONY: bench test system-deps clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -e '.[test]'
	rm -f $(VENV)/.installed-*
	touch $@

bench: $(STAMP)
	$(BIN)/kvtier bench --duration 30

system-deps:
	bash deploy/install-system-deps.sh

test: $(STAMP) system-deps
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) results
