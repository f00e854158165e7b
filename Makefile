# The project's commands; `make help` lists them. `make test` is the one CI
# and the README use.
GO   ?= go
# The repository is one workspace (go.work) of six modules: the pattern and
# the example services (go.mod, what a copier inherits), and, each with its
# own go.mod so that it is not part of that one, the fault lab (lab/), the
# deployment checks (deploy/), the fault-injection suite (e2e/), the test
# scaffolding (testkit/) and the protocol's model (model/). ./... is the
# root module's packages only. Every command below covers all six.
PACKAGES := ./... ./lab/... ./deploy/... ./e2e/... ./testkit/... ./model/...
# sqlc and golangci-lint are Go tools of their own modules under tools/. A
# tool's -modfile cannot be used in workspace mode, so each is built outside
# it; golangci-lint then runs inside it, to see all six modules.
SQLC := GOWORK=off $(GO) tool -modfile=tools/go.mod sqlc
LINT  = $(shell GOWORK=off $(GO) tool -modfile=tools/golangci-lint/go.mod -n golangci-lint)

.PHONY: help run test e2e model bench bench-reconciler soak lint generate schema check-generated vet fmt-check build ci

## help: list the commands
help:
	@awk 'sub(/^## /, "") { split($$0, a, ": "); printf "  make %-16s %s\n", a[1], substr($$0, length(a[1]) + 3) }' $(MAKEFILE_LIST)

## run: the whole system on this machine, without Docker (Go and PostgreSQL's server binaries); Ctrl-C stops it (RUN_PORT_BASE, RUN_DATA_DIR, RUN_DATABASE_URL)
run:
	@$(GO) build -o bin/outboxref-run ./testkit/run
	@bin/outboxref-run

## test: every unit and integration test, with -race, on a throwaway PostgreSQL cluster (or on TEST_DATABASE_URL)
# Four test binaries at once, not one per core: most of a binary's time is
# spent waiting on PostgreSQL, and on two cores the default (two) left the
# linking of the next binaries waiting behind those waits (71-83s against
# 56-61s, measured side by side).
TEST_PARALLEL ?= 4
test:
	$(GO) run ./testkit/withpostgres -- $(GO) test -p $(TEST_PARALLEL) -race -count=1 -timeout 15m $(PACKAGES)

## e2e: the fault-injection suite: real binaries, real clusters, a fault proxy
e2e:
	$(GO) test -tags e2e -count=1 -timeout 20m -v ./e2e/

## model: SPIN checks the delivery protocol's two models, the HTTP hop and the broker's: each property holds, each mutation breaks one (about four and a half minutes; needs spin and gcc)
model:
	$(GO) run ./model/check

## bench: the real binaries with shipped defaults against the database-only bound: intake, burndown, latency, idle CPU, for both sources of new rows and the broker form beside the HTTP hop (about 15 min)
bench:
	$(GO) run ./testkit/bench $(BENCH_FLAGS)

## bench-reconciler: the reconciler's full and incremental pass over 1,000,000 linked students: time, CPU, rows read, the longest statement, and Student's writes beside it (about 10 min)
bench-reconciler:
	$(GO) run ./testkit/bench -reconciler $(BENCH_FLAGS)

## soak: 1,000,000 students through the whole system: memory flat, outbox and inbox bounded by retention (about 35 min)
soak:
	$(GO) run ./testkit/bench -soak $(SOAK_FLAGS)

## lint: golangci-lint with .golangci.yml, over the plain and the e2e build
lint:
	$(LINT) run $(PACKAGES)
	$(LINT) run --build-tags e2e,crashpoints $(PACKAGES)

## generate: regenerate the sqlc query code and the schema snapshots after changing db/queries or db/migrations
generate: schema
	$(SQLC) generate

## schema: regenerate db/schema/*.sql, each database's schema after every migration (pg_dump on a throwaway cluster; a test in make test fails when they are stale)
schema:
	$(GO) run ./testkit/withpostgres -- $(GO) run ./testkit/schemadump/gen

## check-generated: fail when the committed sqlc code is stale, or a query does not fit a schema it runs on
check-generated:
	$(SQLC) diff
	$(SQLC) vet

## vet: go vet, over the plain and the e2e build
vet:
	$(GO) vet $(PACKAGES)
	$(GO) vet -tags e2e,crashpoints $(PACKAGES)

## fmt-check: fail when a Go file is not gofmt-formatted
fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

## build: the three binaries, the reconciler and the fault lab into ./bin
build:
	CGO_ENABLED=0 $(GO) build -o bin/ ./services/student ./services/users ./outbox-sender ./reconciler ./lab

## ci: what .ci/run runs, in order
ci: fmt-check vet lint check-generated model test e2e
