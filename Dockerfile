# syntax=docker/dockerfile:1

# One image holds all four binaries (Student, Users, the outbox sender and
# the fault lab); docker-compose.yml picks the binary per service with
# `command:`. The checks in deploy/ read this file (dockerfile_test.go
# there parses it): every binary compose runs, as a command or as a
# healthcheck, must be built by the `go build` line below, and every port a
# service listens on, published or not, must be in EXPOSE.

FROM golang:1.26-bookworm AS build
WORKDIR /src

# Modules change far less often than code: download them in their own layer
# so an edit to a .go file does not download them again.
COPY go.mod go.sum ./
RUN go mod download

# Only the folders the four binaries import (go list -deps shows them).
# testkit/, e2e/ and the Go code in deploy/ are test scaffolding that no
# shipped binary imports (deploy/layout_test.go checks that), so they stay
# out of the image.
COPY db/ db/
COPY internal/ internal/
COPY services/ services/
COPY outbox-sender/ outbox-sender/
COPY lab/ lab/

# Static binaries (no cgo), so the final image needs no libc. -trimpath keeps
# build paths out of the binaries, -s -w drops the symbol tables.
RUN --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/ ./services/student ./services/users ./outbox-sender ./lab

# Distroless: no shell and no package manager, and the :nonroot tag runs as
# an unprivileged user. It also carries the CA certificates, in case
# SENDER_USERS_URL is ever https.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
USER nonroot:nonroot

# Student, Users and the sender's admin port, in that order; then the lab's
# fault proxy (which the sender calls; compose does not publish it) and its
# page; then Student's and Users' admin ports.
EXPOSE 8080 8081 8082 8083 8084 8090 8091

# No ENTRYPOINT and no CMD on purpose: compose names the binary in `command:`
# (/usr/local/bin is on the image's PATH), and forgetting it fails loudly
# instead of silently starting the wrong service.
