#!/usr/bin/env bash
# Build deploy/Dockerfile with podman, start `serve all` in it, and check what a user meets: /health,
# the chat page at /, a document ingested over HTTP, and one streamed answer grounded on it; then a
# graceful stop (SIGTERM, exit 0). Run from anywhere; needs podman (Debian: apt-get install podman).
#
#   deploy/podman-check.sh
#   BUILD_OPTS="--build-arg PYTHON_IMAGE=localhost/python:3.11-slim -v /opt/wheels:/opt/wheels:ro" \
#   PODMAN_OPTS="--runtime runc" RUN_OPTS="--ulimit nofile=1024:4096 --ulimit nproc=1024:4096" deploy/podman-check.sh
#
# BUILD_OPTS go to `podman build` (a base image or wheels where the registries cannot be reached),
# PODMAN_OPTS to every podman call (an OCI runtime), RUN_OPTS to `podman run` (limits a sandbox allows).
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${IMAGE:-localhost/lookahead-rag:check}
PORT=${PORT:-18080}
NAME=lookahead-rag-check-$$
TENANT=podman-check
STARTUP_S=${STARTUP_S:-900}  # serve all loads the model and the embedder, and times its kernels
# shellcheck disable=SC2086  # the option strings are meant to split into words
pod() { podman ${PODMAN_OPTS:-} "$@"; }
say() { printf 'podman-check: %s\n' "$*"; }

say "building $IMAGE"
# shellcheck disable=SC2086
pod build ${BUILD_OPTS:-} -f deploy/Dockerfile -t "$IMAGE" .
say "starting serve all on 127.0.0.1:$PORT"
# Plaintext and no auth beyond the container's loopback, as docker-compose.yml allows them; published on
# loopback only.
# shellcheck disable=SC2086
pod run -d --name "$NAME" ${RUN_OPTS:-} -p "127.0.0.1:$PORT:8080" -e LAR_TLS_ALLOW_INSECURE=true \
  -e LAR_AUTH_ALLOW_UNAUTHENTICATED=true "$IMAGE"
stop() { pod rm -f "$NAME" >/dev/null 2>&1 || true; }
trap stop EXIT
base="http://127.0.0.1:$PORT"
for _ in $(seq "$STARTUP_S"); do
  curl -fsS "$base/health" >/dev/null 2>&1 && break
  [ "$(pod inspect -f '{{.State.Running}}' "$NAME")" = true ] || { pod logs "$NAME" | tail -40; exit 1; }
  sleep 1
done
curl -fsS "$base/health" | grep -q serving
say "/health: serving"
curl -fsS "$base/" | grep -q '<title>lookahead-rag</title>'
say "/: the chat page"
curl -fsS "$base/v1/documents" -H "x-tenant: $TENANT" -H 'content-type: application/json' \
  -d '{"documents": [{"id": "okapi.md", "title": "The okapi", "text": "The okapi is a giraffid mammal of the Congo. It eats leaves with its long blue tongue."}]}' \
  | grep -q '"object":"ingest"'
say "POST /v1/documents: ingested"
answer=$(curl -fsSN "$base/v1/chat/completions" -H "x-tenant: $TENANT" -H 'content-type: application/json' \
  -d '{"messages": [{"role": "user", "content": "What colour is the okapi'"'"'s tongue?"}], "stream": true, "max_tokens": 12}')
grep -q '"delta":{"role":"assistant","content":"' <<<"$answer"
grep -q '"doc_id":"okapi.md"' <<<"$answer"
grep -q 'data: \[DONE\]' <<<"$answer"
say "one streamed answer, grounded on okapi.md: $(grep -o '"content":"[^"]*"' <<<"$answer" | cut -d'"' -f4 | tr -d '\n')"
pod stop -t 120 "$NAME" >/dev/null
code=$(pod inspect -f '{{.State.ExitCode}}' "$NAME")
[ "$code" = 0 ] || { say "exit code $code"; exit 1; }
say "stopped gracefully (exit 0); all checks passed"
