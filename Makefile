# Every command the README gives is a target here. Each one sets up what it needs first,
# so `make run` and `make test` work on a fresh clone.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)

.PHONY: help install run test test-fast lint controlplane tools node image dev-cluster bench schema clean

help:
	@echo "make run          serve gpuadm on https://127.0.0.1:8443 with the bundled example config"
	@echo "make test         lint, then every test, end-to-end suite included (builds the control plane once)"
	@echo "make test-fast    the tests that need no control plane"
	@echo "make lint         ruff, mypy --strict and the import-layering contracts"
	@echo "make controlplane build kube-apiserver, kube-scheduler and etcd for the e2e suite (cached)"
	@echo "make tools        build kustomize, helm and promtool, to render and check deploy/ in the tests (cached)"
	@echo "make node         install containerd, runc, CNI plugins, buildah, mmdebstrap and umoci for the real node and the image, and conntrack and ss for the bench (Debian, root)"
	@echo "make image        the gpuadm image from the Dockerfile, on a local Debian base; prints its OCI archive and name (cached)"
	@echo "make dev-cluster  a local apiserver, etcd, scheduler, fake GPU nodes, and gpuadm's chart on a real node, to try by hand"
	@echo "make bench        the benchmarks; figures go to bench/results/"
	@echo "make schema       write the chart's schema of policy and quotas from gpuadm's models"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,fast]'
	rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)

run: $(STAMP)
	$(BIN)/gpuadm serve --host 127.0.0.1 --port 8443 --tls-dir .tls \
		--policy examples/policy.yaml --quotas examples/quotas.yaml

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

controlplane:
	bash tests/e2e/controlplane/build.sh

tools:
	bash deploy/tools/install.sh >/dev/null

# The real node of the e2e suite and the image it runs: Debian's packages, installed once.
node:
	bash tests/e2e/node/setup.sh

# As root, with mmdebstrap and buildah; reaches only Debian's mirror and PyPI. See image/build.sh.
image:
	bash image/build.sh

# pytest exits 5 when it collected nothing: that is a broken suite, never a pass.
test: lint $(STAMP) controlplane tools node
	$(BIN)/pytest; status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no tests: the suite is broken" >&2; fi; \
	exit $$status

test-fast: $(STAMP) tools
	$(BIN)/pytest -m "not e2e"

# With root and the node's packages, gpuadm runs on a real node, installed by its chart;
# without them ("-": setup may fail), as a process, and the dev cluster says why.
dev-cluster: $(STAMP) controlplane tools
	-bash tests/e2e/node/setup.sh
	$(BIN)/python -m tests.e2e.dev_cluster

# vegeta, the compiled load generator, is built once from its Go module like the tools above.
# The real node's packages include conntrack, which the bursts' balancer in the kernel needs
# (bench/kernel.py); without root the benchmark balances with a relay instead.
schema: $(STAMP)
	PYTHONPATH=. $(BIN)/python deploy/tools/values_schema.py

bench: $(STAMP) controlplane
	-bash tests/e2e/node/setup.sh
	bash bench/tools.sh >/dev/null
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .tls .pytest_cache .mypy_cache .ruff_cache .hypothesis
