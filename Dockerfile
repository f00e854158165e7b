# syntax=docker/dockerfile:1

# One image holds all five binaries (Student, Users, the outbox sender, the
# reconciler and the fault lab); docker-compose.yml picks the binary per service with
# `command:`. The checks in deploy/ read this file (dockerfile_test.go
# there parses it): every binary compose runs, as a command or as a
# healthcheck, must be built by the `go build` line below, and every port a
# service listens on, published or not, must be in EXPOSE.

FROM golang:1.26-bookworm AS build
WORKDIR /src

# Modules change far less often than code: download them in their own layer
# so an edit to a .go file does not download them again. The fault lab is a
# module of its own (lab/go.mod), so that the toxiproxy it uses stays out of
# the go.mod a copier of the pattern inherits; so is the test scaffolding
# (testkit/go.mod), of which the lab takes the invariant checker. The root
# go.mod names testkit/ and model/ (its tests use them) with a replace
# directive each, and Go reads a replaced module's go.mod even when no
# package of it is built: model/go.mod comes too, and nothing else of model/.
COPY go.mod go.sum ./
COPY lab/go.mod lab/go.sum lab/
COPY testkit/go.mod testkit/go.sum testkit/
COPY model/go.mod model/
RUN go mod download && cd lab && go mod download

# Only the folders the five binaries import (go list -deps shows them; the
# lab's invariant checker is the one piece of testkit/ it takes).
# deploy/layout_test.go checks that every one is copied and none ignored.
COPY db/ db/
COPY internal/ internal/
COPY services/ services/
COPY outbox-sender/ outbox-sender/
COPY reconciler/ reconciler/
COPY lab/ lab/
COPY testkit/invariant/ testkit/invariant/

# One workspace of the three modules, as the repository's go.work has it
# (which also names modules the image leaves out). Static binaries (no cgo),
# so the final image needs no libc. -trimpath keeps build paths out of the
# binaries, -s -w drops the symbol tables.
RUN --mount=type=cache,target=/root/.cache/go-build \
    go work init . ./lab ./testkit && \
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/ ./services/student ./services/users ./outbox-sender ./reconciler ./lab

# Distroless: no shell and no package manager, and the :nonroot tag runs as
# an unprivileged user. It also carries the CA certificates, in case
# SENDER_USERS_URL is ever https.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
USER nonroot:nonroot

# Student, Users and the sender's admin port, in that order; then the lab's
# fault proxy (which the sender calls; compose does not publish it) and its
# page; then Student's, Users' and the reconciler's admin ports.
EXPOSE 8080 8081 8082 8083 8084 8090 8091 8092

# No ENTRYPOINT and no CMD on purpose: compose names the binary in `command:`
# (/usr/local/bin is on the image's PATH), and forgetting it fails loudly
# instead of silently starting the wrong service.
