# syntax=docker/dockerfile:1

# One image holds all four binaries (Student, Users, the outbox sender and
# the fault lab); docker-compose.yml picks the binary per service with
# `command:`. e2e/compose_test.go reads this file: it checks that every
# binary compose runs, as a command or as a healthcheck, is built by the
# `go build` line below, and that every port a service listens on, published
# or not, is in EXPOSE.

FROM golang:1.26-bookworm AS build
WORKDIR /src

# Modules change far less often than code: download them in their own layer
# so an edit to a .go file does not download them again.
COPY go.mod go.sum ./
RUN go mod download

# Only the folders the four binaries import (go list -deps shows them).
# testkit/ and e2e/ are test scaffolding that no shipped binary imports
# (e2e/layout_test.go checks that), so they stay out of the image.
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
