# The project's commands. `make test` is the one CI and the README use.
GO   ?= go
SQLC := $(GO) tool -modfile=tools/go.mod sqlc

.PHONY: test e2e bench generate check-generated vet fmt-check build ci

## test: every unit and integration test, on a throwaway PostgreSQL cluster
## (or on the server in TEST_DATABASE_URL when it is set).
test:
	$(GO) run ./testkit/withpostgres -- $(GO) test -race -count=1 -timeout 15m ./...

## e2e: the fault-injection suite: real binaries, real clusters, a fault proxy.
e2e:
	$(GO) test -tags e2e -count=1 -timeout 20m -v ./e2e/

## generate: regenerate the sqlc query code after changing db/queries or db/migrations.
generate:
	$(SQLC) generate

## check-generated: fail when the committed sqlc code is stale.
check-generated:
	$(SQLC) diff

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

## build: the three binaries into ./bin
build:
	CGO_ENABLED=0 $(GO) build -o bin/ ./services/student ./services/users ./outbox-sender

ci: fmt-check vet check-generated test e2e

## bench: sender throughput against its one-row-at-a-time baseline, on a
## throwaway PostgreSQL; prints every round and the medians.
bench:
	$(GO) run ./testkit/withpostgres -- $(GO) run ./testkit/bench
