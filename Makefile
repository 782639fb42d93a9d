# Taskstore. `make run` starts a local 3-node cluster; `make test` runs the quick
# checks (minutes); `make test-full` runs every test CI runs (.ci/run calls it).
GO        ?= go
BIN       := bin
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X github.com/e1158ecb/taskstore/cmd/internal/buildinfo.Version=$(VERSION)
PKGS      := ./...
FUZZTIME  ?= 10s
# staticcheck's version is pinned here; `go run` fetches it through the module proxy.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: all build run test test-full unit fmt-check vet staticcheck race fuzz-short fuzz proto clean certs docs docs-check

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...

## run: a local 3-node cluster (a process per node) and a proxy (data in ./data/dev)
# The built binary, not `go run`: go run exits 1 on Ctrl-C even when the
# program stopped cleanly, and make then reports an error.
run: build
	$(BIN)/taskstored dev

## test: the quick check before a commit: gofmt, vet, staticcheck, and every
##       package's tests with -short and without -race: the long end-to-end
##       scenarios (real processes killed and restarted, node and shard moves,
##       damaged files) skip. Each package's fuzz seeds still run as tests.
## test-full: what CI runs (.ci/run): the same checks, every test with -race
##       (-short not set), the state machine's tests again on the on-disk
##       store, and brief fuzzing of each fuzz target (about 25 minutes on 2 cores).
test: fmt-check vet staticcheck docs-check unit

test-full: fmt-check vet staticcheck race fuzz-short

## docs: regenerate docs/taskctl.md: cmd/taskctl/manual.md (written by hand)
##       followed by the command reference generated from taskctl's cobra tree.
## docs-check: fail when docs/taskctl.md is not what `make docs` would write.
docs:
	$(GO) test -count=1 -run '^TestManualMatchesCommands$$' ./cmd/taskctl/ -update-docs

docs-check:
	$(GO) test -count=1 -run '^TestManualMatchesCommands$$' ./cmd/taskctl/

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)

staticcheck:
	$(GO) run $(STATICCHECK) $(PKGS)

unit: build
	TASKSTORE_BIN=$(CURDIR)/$(BIN) $(GO) test -short -count=1 -p 1 -timeout 20m $(PKGS)

# -p 1: one package at a time. Every package starts real Raft clusters; on
# two cores, several at once under -race starve heartbeats into elections.
# The state machine's tests run a second time on the on-disk store
# (fsm/ondisk): one applier, two stores, the same answers. The
# tests that run on both stores by themselves (property, transcripts,
# fixture, slot moves) are skipped the second time.
race: build
	TASKSTORE_BIN=$(CURDIR)/$(BIN) $(GO) test -race -count=1 -p 1 -timeout 30m $(PKGS)
	$(GO) test -race -count=1 ./fsm/ -fsm.ondisk -skip 'TestProperty|TestTranscript|TestSnapshotFixture|TestOnDisk|TestMarkerSnapshots|TestSlotMove|TestSlotSteps|TestSlotStates|TestGetServed'

# Each fuzz target (decoders, validators, snapshot and gossip readers, the
# Raft stream, the HTTP/JSON gateway) runs
# briefly; `make fuzz FUZZTIME=5m` runs longer.
FUZZPKGS := ./backup/ ./fsm/ ./fsm/ondisk/ ./cluster/ ./cluster/nodelog/ ./rpc/ ./auth/ ./proxy/
fuzz-short:
	GO=$(GO) scripts/fuzz-short.sh $(FUZZTIME) $(FUZZPKGS)

fuzz:
	$(MAKE) fuzz-short FUZZTIME=5m

## proto: regenerate Go code from the .proto files, with generators pinned here and
## installed into ./bin/proto (protoc itself: `apt-get install protobuf-compiler`).
## The HTTP/JSON bindings come from taskstore_http.yaml, not from annotations in the .proto;
## their OpenAPI (Swagger 2.0) description, api/taskstorepb/taskstore.swagger.json, from the
## same file and taskstore_openapi.yaml (taskproxy serves it at /openapi.json), with the
## routes the proxy serves by hand (POST /v1/inserts) merged in from taskstore_openapi_hand.json.
## `go generate ./...` runs the same targets (a go:generate line beside each proto).
PROTOC_GEN_GO      := google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.10
PROTOC_GEN_GO_GRPC := google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.5.1
PROTOC_GEN_GW      := github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-grpc-gateway@v2.32.0
PROTOC_GEN_OPENAPI := github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-openapiv2@v2.32.0
PROTO_BIN          := $(CURDIR)/bin/proto
PROTOC             := PATH=$(PROTO_BIN):$$PATH protoc
.PHONY: proto-tools proto-api proto-fsm proto-meta proto-peer proto-check
proto: proto-api proto-fsm proto-meta proto-peer
proto-tools:
	@command -v protoc >/dev/null || { echo "protoc not found: apt-get install protobuf-compiler"; exit 1; }
	@for t in $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC) $(PROTOC_GEN_GW) $(PROTOC_GEN_OPENAPI); do \
		GOBIN=$(PROTO_BIN) GOFLAGS= $(GO) install $$t || exit 1; done
proto-api: proto-tools
	$(PROTOC) -I api/proto -I /usr/include --go_out=. --go_opt=module=github.com/e1158ecb/taskstore \
		--go-grpc_out=. --go-grpc_opt=module=github.com/e1158ecb/taskstore \
		--grpc-gateway_out=. --grpc-gateway_opt=module=github.com/e1158ecb/taskstore \
		--grpc-gateway_opt=grpc_api_configuration=api/proto/taskstore/v1/taskstore_http.yaml \
		--openapiv2_out=api/taskstorepb --openapiv2_opt=allow_merge=true,merge_file_name=taskstore \
		--openapiv2_opt=grpc_api_configuration=api/proto/taskstore/v1/taskstore_http.yaml \
		--openapiv2_opt=openapi_configuration=api/proto/taskstore/v1/taskstore_openapi.yaml \
		api/proto/taskstore/v1/taskstore.proto
	$(GO) run ./api/internal/openapimerge api/taskstorepb/taskstore.swagger.json api/proto/taskstore/v1/taskstore_openapi_hand.json
proto-fsm: proto-tools
	$(PROTOC) -I fsm/fsmpb --go_out=. --go_opt=module=github.com/e1158ecb/taskstore fsm/fsmpb/fsm.proto
proto-meta: proto-tools
	$(PROTOC) -I cluster/metapb --go_out=. --go_opt=module=github.com/e1158ecb/taskstore cluster/metapb/meta.proto
proto-peer: proto-tools
	$(PROTOC) -I cluster/peerpb -I cluster/metapb --go_out=. --go_opt=module=github.com/e1158ecb/taskstore \
		--go-grpc_out=. --go-grpc_opt=module=github.com/e1158ecb/taskstore cluster/peerpb/peer.proto

## proto-check: regenerate and fail if the generated code differs from what is
## committed (a .proto edited without `make proto`, or a generator version drift).
## The protoc version line in the headers is ignored: Debian's protoc is what CI has.
proto-check: proto
	@git diff --exit-code -I '^// .*protoc ' -- '*.pb.go' '*.pb.gw.go' '*.swagger.json' || \
		{ echo "generated code differs from the .proto files: run make proto and commit"; exit 1; }

## certs: a CA, node/admin/proxy/client certificates, a gossip key and tokens in ./certs
## for a secured local cluster (docs/security.md); refuses to replace existing files.
certs:
	$(GO) run ./cmd/taskctl cert local --dir certs

clean:
	rm -rf $(BIN) data

## ---- deploy: container images and the compose cluster (deploy/, docs/deploy.md) ----
## image:            taskstore:dev (and taskstore:$(VERSION)) FROM scratch, binaries built on the host
## prometheus-image: taskstore-prometheus:dev from Debian's prometheus package on the host
## compose-up/down:  3 nodes + 2 proxies + Prometheus (deploy/docker-compose.yml); ports on 127.0.0.1
## smoke:            deploy/smoke.sh: build, start, write, kill a node, write again, tear down
## deploy-check:     offline checks of deploy/ (YAML, manifests, rules, dashboard); no Docker needed
IMAGE         ?= taskstore
IMAGE_TAG     ?= dev
PROM_IMAGE    ?= taskstore-prometheus
IMAGE_CTX     := deploy/.build
IMAGE_VERSION  = $(subst +,-,$(VERSION))
COMPOSE_FILE  ?= deploy/docker-compose.yml
# compose v2 plugin when present, else the v1 `docker-compose` CLI (evaluated lazily).
COMPOSE       ?= $(shell docker compose version >/dev/null 2>&1 && echo 'docker compose' || echo docker-compose)

.PHONY: image prometheus-image compose-up compose-down compose-ps compose-logs smoke deploy-check

image:
	rm -rf $(IMAGE_CTX)/taskstore
	mkdir -p $(IMAGE_CTX)/taskstore/bin $(IMAGE_CTX)/taskstore/etc $(IMAGE_CTX)/taskstore/data $(IMAGE_CTX)/taskstore/tmp
	CGO_ENABLED=0 GOOS=linux $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(IMAGE_CTX)/taskstore/bin/ \
		./cmd/taskstored ./cmd/taskproxy ./cmd/taskctl
	printf 'root:x:0:0:root:/:/sbin/nologin\ntaskstore:x:65532:65532:taskstore:/data:/sbin/nologin\n' > $(IMAGE_CTX)/taskstore/etc/passwd
	printf 'root:x:0:\ntaskstore:x:65532:\n' > $(IMAGE_CTX)/taskstore/etc/group
	touch $(IMAGE_CTX)/taskstore/data/.keep $(IMAGE_CTX)/taskstore/tmp/.keep
	docker build --build-arg VERSION=$(IMAGE_VERSION) -f deploy/Dockerfile \
		-t $(IMAGE):$(IMAGE_TAG) -t $(IMAGE):$(IMAGE_VERSION) $(IMAGE_CTX)/taskstore

prometheus-image:
	@command -v prometheus >/dev/null || { echo "prometheus not found: apt-get install -y prometheus (Debian's package)"; exit 1; }
	rm -rf $(IMAGE_CTX)/prometheus
	mkdir -p $(IMAGE_CTX)/prometheus/bin $(IMAGE_CTX)/prometheus/etc/prometheus $(IMAGE_CTX)/prometheus/prometheus \
		$(IMAGE_CTX)/prometheus/lib $(IMAGE_CTX)/prometheus/lib64
	cp "$$(command -v prometheus)" "$$(command -v promtool)" $(IMAGE_CTX)/prometheus/bin/
	# every shared library prometheus and promtool load (Debian's build: glibc only), at its own path
	for f in $$(ldd $(IMAGE_CTX)/prometheus/bin/prometheus $(IMAGE_CTX)/prometheus/bin/promtool | grep -o '/[^ ]*\.so[^ ]*' | sort -u); do \
		mkdir -p $(IMAGE_CTX)/prometheus/$$(dirname $$f) && cp -L $$f $(IMAGE_CTX)/prometheus/$$f; done
	cp deploy/prometheus/prometheus.yml deploy/prometheus/alerts.yml $(IMAGE_CTX)/prometheus/etc/prometheus/
	# Debian's web UI assets (--web.local-assets), symlinks into /usr/share/javascript resolved
	mkdir -p $(IMAGE_CTX)/prometheus/usr/share/prometheus/web
	if [ -d /usr/share/prometheus/web ]; then cp -rL /usr/share/prometheus/web/. $(IMAGE_CTX)/prometheus/usr/share/prometheus/web/ || true; fi
	printf 'nobody:x:65534:65534:nobody:/prometheus:/sbin/nologin\n' > $(IMAGE_CTX)/prometheus/etc/passwd
	printf 'nogroup:x:65534:\n' > $(IMAGE_CTX)/prometheus/etc/group
	touch $(IMAGE_CTX)/prometheus/prometheus/.keep
	docker build --build-arg PROMETHEUS_VERSION="$$(prometheus --version 2>&1 | awk 'NR==1{print $$3}')" \
		-f deploy/prometheus/Dockerfile -t $(PROM_IMAGE):$(IMAGE_TAG) $(IMAGE_CTX)/prometheus

compose-up: image prometheus-image
	$(COMPOSE) -f $(COMPOSE_FILE) up -d

compose-down:
	$(COMPOSE) -f $(COMPOSE_FILE) down -v --remove-orphans

compose-ps:
	$(COMPOSE) -f $(COMPOSE_FILE) ps

compose-logs:
	$(COMPOSE) -f $(COMPOSE_FILE) logs --tail=100

smoke:
	deploy/smoke.sh

# Debian's python3 with python3-yaml when it has it (what .ci/run installs),
# else whatever python3 is first on PATH.
PYTHON ?= $(shell /usr/bin/python3 -c 'import yaml' 2>/dev/null && echo /usr/bin/python3 || echo python3)

deploy-check:
	$(PYTHON) deploy/validate.py
	bash -n deploy/smoke.sh
	@if command -v promtool >/dev/null; then promtool check rules deploy/prometheus/alerts.yml && \
		promtool check config deploy/prometheus/prometheus.yml; else echo "promtool not found (apt-get install prometheus): rules not checked"; fi
	@if command -v kubectl >/dev/null; then kubectl kustomize deploy/kubernetes >/dev/null && echo "kustomize build: ok"; \
		else echo "kubectl not found: kustomization not rendered"; fi
	@if command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1; then \
		$(COMPOSE) -f $(COMPOSE_FILE) config -q && echo "compose config: ok"; fi

## helm-check: the Helm chart (deploy/helm/taskstore): helm, pinned here, installed from the Go
##             module proxy into bin/tools; `helm lint --strict` with the default values and each
##             ci/*-values.yaml; the chart rendered with each of the 3 value sets; every rendered
##             object and every manifest of deploy/kubernetes decoded strictly into its Kubernetes
##             (k8s.io/api) or prometheus-operator type by deploy/helm/validate, a module of its own
##             (no cluster, no network once the modules are downloaded); the chart's copy of the
##             alert rules equal to deploy/prometheus/alerts.yml.
HELM_VERSION  ?= v3.22.0
HELM          := $(CURDIR)/bin/tools/helm
CHART         := deploy/helm/taskstore
HELM_RENDER   := $(CURDIR)/bin/helm-render
# helm template renders for this Kubernetes version (the chart needs 1.24+; helm's default is 1.20).
HELM_KUBE_VERSION ?= 1.30.0

.PHONY: helm-check

helm-check:
	@# helm's own version string drops the patch level when built by go install: ask the module
	@$(GO) version -m $(HELM) 2>/dev/null | grep -Eq '^\s+mod\s+helm.sh/helm/v3\s+$(HELM_VERSION)\s' || \
		GOBIN=$(CURDIR)/bin/tools GOFLAGS= $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)
	@diff -u deploy/prometheus/alerts.yml $(CHART)/files/alerts.yml || \
		{ echo "$(CHART)/files/alerts.yml differs from deploy/prometheus/alerts.yml: copy it"; exit 1; }
	rm -rf $(HELM_RENDER) && mkdir -p $(HELM_RENDER)
	$(HELM) lint --strict $(CHART)
	$(HELM) template taskstore $(CHART) --namespace taskstore --kube-version $(HELM_KUBE_VERSION) > $(HELM_RENDER)/default.yaml
	@for v in $(CHART)/ci/*-values.yaml; do \
		echo "helm lint/template -f $$v"; \
		$(HELM) lint --strict $(CHART) -f $$v >/dev/null || { $(HELM) lint --strict $(CHART) -f $$v; exit 1; }; \
		$(HELM) template taskstore $(CHART) --namespace taskstore --kube-version $(HELM_KUBE_VERSION) -f $$v \
			> $(HELM_RENDER)/$$(basename $$v .yaml).yaml || exit 1; done
	$(MAKE) -s kubernetes-manifests KUBERNETES_MANIFEST=$(HELM_RENDER)/kubernetes.yaml
	@diff -u deploy/kubernetes/taskstore.yaml $(HELM_RENDER)/kubernetes.yaml >/dev/null || \
		{ diff -u deploy/kubernetes/taskstore.yaml $(HELM_RENDER)/kubernetes.yaml | head -40; \
		  echo "deploy/kubernetes/taskstore.yaml is not the chart's rendering: make kubernetes-manifests"; exit 1; }
	cd deploy/helm/validate && GOFLAGS= $(GO) run . $(HELM_RENDER)/*.yaml \
		$$(ls $(CURDIR)/deploy/kubernetes/*.yaml | grep -v kustomization.yaml)

## kubernetes-manifests: deploy/kubernetes/taskstore.yaml, the kustomize base, rendered from the
##             chart with its default values (release taskstore); helm-check fails when it is stale.
KUBERNETES_MANIFEST ?= deploy/kubernetes/taskstore.yaml
.PHONY: kubernetes-manifests
kubernetes-manifests:
	@{ echo "# Generated by make kubernetes-manifests from the Helm chart deploy/helm/taskstore"; \
	   echo "# (helm template taskstore, default values): edit the chart, not this file."; \
	   $(HELM) template taskstore $(CHART) --namespace taskstore --kube-version $(HELM_KUBE_VERSION); } > $(KUBERNETES_MANIFEST)

## ---- chaos: fault injection with correctness checkers (testing/chaos, docs/testing.md) ----
## test-chaos: every chaos scenario once, with -race (a few minutes); one SUMMARY line per scenario
## soak:       the in-process scenarios in a loop for DURATION (make soak DURATION=1h), without -race;
##             LOAD=k runs k times the default workload's clients (make soak DURATION=30m LOAD=4)
DURATION      ?= 1h
LOAD          ?= 1
CHAOS_TIMEOUT ?= 15m
SOAK_TIMEOUT  ?= 25h

## test-failover: kill -9 the leader of a written shard 20 times (3 node processes at default flags,
##                a proxy), print the write gap's p50 and max straight and through the proxy (~3 min);
##                FAILOVER_FLAGS adds node flags (make test-failover FAILOVER_FLAGS='--raft-timeout-scale 2')
FAILOVER_FLAGS ?=

.PHONY: test-chaos soak test-failover

test-chaos: build
	TASKSTORE_CHAOS=1 TASKSTORE_BIN=$(CURDIR)/$(BIN) $(GO) test -race -count=1 -timeout $(CHAOS_TIMEOUT) -v -run '^TestChaos' ./testing/chaos/

test-failover: build
	TASKSTORE_FAILOVER_TARGETS=1 TASKSTORE_FAILOVER_FLAGS='$(FAILOVER_FLAGS)' TASKSTORE_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 15m -v -run '^TestFailoverWriteGap$$' ./testing/e2e/

soak: build
	TASKSTORE_CHAOS=1 TASKSTORE_SOAK=$(DURATION) TASKSTORE_LOAD=$(LOAD) TASKSTORE_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout $(SOAK_TIMEOUT) -v -run '^TestSoak$$' ./testing/chaos/

## ---- containers: the chaos scenarios across containers (testing/containers, docs/testing.md) ----
## test-containers: 3 nodes + proxy, then 5 nodes + proxy, each on a private Docker network, with
##                  `docker network disconnect` and `docker kill`; a full disk; 3 nodes capped at
##                  320 MiB taking inserts past their memory (TestContainersMemoryBudget, memory then
##                  disk: ~3.5 minutes); one SUMMARY line per scenario.
## Without -race: the nodes are the static binaries of the image, built without it; the test
## process only runs the workload and the checkers, next to 4-6 containers on 2 cores.
CONTAINERS_TIMEOUT ?= 15m

.PHONY: test-containers

test-containers: image
	TASKSTORE_DOCKER=1 TASKSTORE_IMAGE=$(IMAGE):$(IMAGE_TAG) $(GO) test -count=1 -timeout $(CONTAINERS_TIMEOUT) -v -run '^TestContainers' ./testing/containers/

## ---- bench: the performance suite (cmd/taskbench, docs/performance.md) ----
## bench: `taskbench suite`: inserts (1 and 32 clients, batched), claim+delete direct and via a proxy,
##        an open-loop claim+delete at half the direct maximum, each on a fresh `--local 3` cluster,
##        and the same claim+delete on a throwaway PostgreSQL (--baseline postgres --local; skipped
##        with a message unless Debian's postgresql package is installed), then claim+delete 10 tasks
##        at a time (--claim-limit 10) via a proxy and on PostgreSQL; prints one table.
##        BENCHTIME is the measured time of each run (make bench BENCHTIME=5s).
BENCHTIME ?= 10s

.PHONY: bench

bench: build
	$(BIN)/taskbench suite --benchtime $(BENCHTIME)

# The capacity run: load TASKS tasks into a 3-node dev cluster on
# disk, then RSS and disk per node, restart time, and claims beside the load
# against alone (scripts/capacity.sh says what it prints; ~12 min at 10M).
.PHONY: capacity
TASKS ?= 10000000

capacity: build
	TASKS=$(TASKS) TASKSTORE_BIN=$(BIN) scripts/capacity.sh
