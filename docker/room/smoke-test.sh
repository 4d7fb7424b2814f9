#!/usr/bin/env bash
# Build the room's images and check them (make room-smoke): two learners log in to the hub,
# each gets a container of their own and runs a 2-rank launch in it; neither reaches the
# other's rendezvous store, shared memory or processes (tests/room/smoke.py). CI does not run
# this: it needs a Docker engine and a few GB of disk. docker/room/README.md records a run.
#
# Settings (environment):
#   WORKSHOP_IMAGE=labkit:workshop  the course image the learners' image extends (built from
#                                   docker/Dockerfile when missing, on BASE_IMAGE)
#   BASE_IMAGE=img                  the course image's base (default: docker/Dockerfile's)
#   HUB_BASE_IMAGE=img              the hub's base (default: Dockerfile.hub's)
#   SKIP_BUILD=1                    use the images as they are
#   BUILD_NETWORK=host              docker build --network (a daemon without a bridge)
#   BUILTIN_FRONTEND=1              drop `# syntax=` (a daemon that cannot pull the frontend)
#   PIP_CERT_FILE=file              CA bundle for pip behind a TLS-inspecting proxy
#   SUBNET=198.19.0.0/24            the room network's addresses (default: Docker's choice)
#   PORT=18000                      the hub on 127.0.0.1:PORT
#   GPU_IDS=0,1                     GPUs the hub deals (a GPU box)
#   MEMLOCK=                        the learners' locked-memory limit (default -1, unlimited;
#                                   empty: Docker's default, for a daemon that may not raise it)
#   PYTHON=.venv/bin/python         runs tests/room/smoke.py (needs websocket-client)
set -euo pipefail

cd "$(dirname "$0")/../.."
DOCKER=${DOCKER:-docker}
WORKSHOP_IMAGE=${WORKSHOP_IMAGE:-labkit:workshop}
PORT=${PORT:-18000}
NETWORK=labkit-room-smoke-$$
HUB=labkit-room-hub-$$
PYTHON=${PYTHON:-.venv/bin/python}
LEARNERS=(alice bob)

say() { printf '[room-smoke %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
fail() {
    say "FAILED: $*" >&2
    exit 1
}

build() { # build DOCKERFILE TAG [docker build args...]
    local file=$1 tag=$2
    shift 2
    local args=(build --progress plain --tag "$tag" "$@")
    [ -n "${BUILD_NETWORK:-}" ] && args+=(--network "$BUILD_NETWORK")
    local cert=${PIP_CERT_FILE:-${PIP_CERT:-}}
    [ -n "$cert" ] && args+=(--secret "id=pip-cert,src=$cert")
    local start=$SECONDS log
    log=$(mktemp)
    if [ -n "${BUILTIN_FRONTEND:-}" ]; then
        sed '/^# syntax=/d' "$file" | DOCKER_BUILDKIT=1 "$DOCKER" "${args[@]}" --file - . > "$log" 2>&1 ||
            { tail -n 30 "$log" >&2; fail "building $tag (log: $log)"; }
    else
        DOCKER_BUILDKIT=1 "$DOCKER" "${args[@]}" --file "$file" . > "$log" 2>&1 ||
            { tail -n 30 "$log" >&2; fail "building $tag (log: $log)"; }
    fi
    say "built $tag in $((SECONDS - start)) s: $(("$("$DOCKER" image inspect --format '{{.Size}}' "$tag")" / 1000000)) MB"
}

if [ -z "${SKIP_BUILD:-}" ]; then
    if ! "$DOCKER" image inspect "$WORKSHOP_IMAGE" > /dev/null 2>&1; then
        build docker/Dockerfile "$WORKSHOP_IMAGE" ${BASE_IMAGE:+--build-arg "BASE_IMAGE=$BASE_IMAGE"}
    fi
    build docker/room/Dockerfile.learner labkit:room-learner --build-arg "LEARNER_BASE=$WORKSHOP_IMAGE"
    build docker/room/Dockerfile.hub labkit:room-hub ${HUB_BASE_IMAGE:+--build-arg "BASE_IMAGE=$HUB_BASE_IMAGE"}
fi

cleanup() {
    for name in "${LEARNERS[@]}"; do
        "$DOCKER" rm --force "jupyter-$name" > /dev/null 2>&1 || true
        "$DOCKER" volume rm "labkit-room-$name" > /dev/null 2>&1 || true
    done
    "$DOCKER" rm --force "$HUB" > /dev/null 2>&1 || true
    "$DOCKER" network rm "$NETWORK" > /dev/null 2>&1 || true
}
trap cleanup EXIT

"$DOCKER" network create ${SUBNET:+--subnet "$SUBNET"} "$NETWORK" > /dev/null
say "network $NETWORK: $("$DOCKER" network inspect --format '{{.Driver}} {{range .IPAM.Config}}{{.Subnet}}{{end}}' "$NETWORK")"
"$DOCKER" run --detach --name "$HUB" --network "$NETWORK" --network-alias hub \
    --publish "127.0.0.1:$PORT:8000" \
    --volume /var/run/docker.sock:/var/run/docker.sock \
    --env LABKIT_ROOM_NETWORK="$NETWORK" --env LABKIT_ROOM_IMAGE=labkit:room-learner \
    --env LABKIT_ROOM_LEARNERS="$(IFS=,; echo "${LEARNERS[*]}")" \
    --env LABKIT_ROOM_GPU_IDS="${GPU_IDS:-}" --env LABKIT_ROOM_MEMORY=4G \
    --env LABKIT_ROOM_MEMLOCK="${MEMLOCK--1}" \
    labkit:room-hub > /dev/null
say "started the hub $HUB on 127.0.0.1:$PORT"
start=$SECONDS
until curl --silent --fail "http://127.0.0.1:$PORT/hub/api/" > /dev/null; do
    [ "$("$DOCKER" inspect --format '{{.State.Running}}' "$HUB")" = true ] ||
        fail "the hub stopped: $("$DOCKER" logs --tail 30 "$HUB" 2>&1)"
    [ $((SECONDS - start)) -lt 120 ] || fail "the hub did not answer within 120 s"
    sleep 1
done
say "the hub answers after $((SECONDS - start)) s: $(curl --silent "http://127.0.0.1:$PORT/hub/api/")"

start=$SECONDS
if ! "$PYTHON" -m tests.room.smoke "http://127.0.0.1:$PORT/" "${LEARNERS[@]}"; then
    "$DOCKER" logs --tail 60 "$HUB" >&2
    fail "the learners' check"
fi
say "two learners, two containers: $((SECONDS - start)) s"
"$DOCKER" ps --filter "name=jupyter-" --format '{{.Names}} {{.Image}} {{.Status}}'
for name in "${LEARNERS[@]}"; do
    say "jupyter-$name: $("$DOCKER" inspect --format \
        'network {{.HostConfig.NetworkMode}}, cpu quota {{.HostConfig.CpuQuota}} per {{.HostConfig.CpuPeriod}} us, memory {{.HostConfig.Memory}}, shm {{.HostConfig.ShmSize}}, ulimits {{.HostConfig.Ulimits}}, gpus {{.HostConfig.DeviceRequests}}, health {{.State.Health.Status}}' \
        "jupyter-$name")"
done
say "PASSED"
