#!/usr/bin/env bash
# Build the workshop image and check that it works (make image-smoke). CI does not run this:
# it needs a Docker engine with BuildKit and a few GB of disk; docker/README.md records a run.
#
# Checks, in a container started with the image's default command (JupyterLab):
#   1. /api/status refuses a request without the token (403) and answers with it (200),
#      and the JupyterLab page opens with ?token=...;
#   2. Docker's HEALTHCHECK reports the container healthy;
#   3. a 2-rank lk.launch runs an all_reduce inside the container;
#   4. the learner (not root) can pip install into the image's venv;
#   5. the learners' image carries no dev tools (pytest, ruff).
#
# Settings (environment):
#   BASE_IMAGE=img          build on this base (default: the Dockerfile's CUDA base)
#   IMAGE=labkit:smoke      the tag to build (or to test, with SKIP_BUILD=1)
#   SKIP_BUILD=1            test IMAGE as it is
#   BUILD_NETWORK=host      docker build --network (a daemon started with --bridge=none needs host)
#   RUN_NETWORK=none        docker run --network (default bridge, which publishes the port on
#                           127.0.0.1:PORT; with none, every request comes from inside the container)
#   PORT=18888              the host port for the bridge network
#   BUILTIN_FRONTEND=1      build without the Dockerfile's `# syntax=` line, so that the daemon's
#                           built-in Dockerfile frontend parses it: for a daemon that cannot pull
#                           docker/dockerfile:1 (no registry)
#   PIP_CERT_FILE=file      the CA bundle pip in the build trusts, for a TLS-inspecting proxy
#                           (docker build --secret id=pip-cert; default: the host's PIP_CERT)
#   GPUS=all                docker run --gpus (a GPU box: the all_reduce then runs on NCCL)
#   LOG_DIR=dir             where build.log goes (default: a temporary directory)
set -euo pipefail

cd "$(dirname "$0")/.."
IMAGE=${IMAGE:-labkit:smoke}
PORT=${PORT:-18888}
RUN_NETWORK=${RUN_NETWORK:-bridge}
LOG_DIR=${LOG_DIR:-$(mktemp -d)}
NAME=labkit-smoke-$$
DOCKER=${DOCKER:-docker}

say() { printf '[smoke %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
fail() {
    say "FAILED: $*" >&2
    exit 1
}

# --- build ---
if [ -z "${SKIP_BUILD:-}" ]; then
    build=(build --progress plain --tag "$IMAGE")
    [ -n "${BASE_IMAGE:-}" ] && build+=(--build-arg "BASE_IMAGE=$BASE_IMAGE")
    [ -n "${BUILD_NETWORK:-}" ] && build+=(--network "$BUILD_NETWORK")
    cert=${PIP_CERT_FILE:-${PIP_CERT:-}}
    [ -n "$cert" ] && build+=(--secret "id=pip-cert,src=$cert")
    if [ -n "${BUILTIN_FRONTEND:-}" ]; then
        build+=(--file - .)
        dockerfile() { sed '/^# syntax=/d' docker/Dockerfile; }
    else
        build+=(--file docker/Dockerfile .)
        dockerfile() { :; }
    fi
    say "docker ${build[*]}  (log: $LOG_DIR/build.log)"
    start=$SECONDS
    if ! dockerfile | DOCKER_BUILDKIT=1 "$DOCKER" "${build[@]}" > "$LOG_DIR/build.log" 2>&1; then
        tail -n 30 "$LOG_DIR/build.log" >&2
        fail "the build failed (log: $LOG_DIR/build.log)"
    fi
    say "built $IMAGE in $((SECONDS - start)) s"
fi
size=$("$DOCKER" image inspect --format '{{.Size}}' "$IMAGE")
say "image $IMAGE: $((size / 1000000)) MB, base $("$DOCKER" image inspect \
    --format '{{index .Config.Labels "org.opencontainers.image.base.name"}}' "$IMAGE")"

# --- run JupyterLab (the default command) ---
JUPYTER_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
export JUPYTER_TOKEN # docker run -e JUPYTER_TOKEN: the value stays off the command line
run=(run --detach --name "$NAME" --network "$RUN_NETWORK" --ipc=host --env JUPYTER_TOKEN)
[ "$RUN_NETWORK" = bridge ] && run+=(--publish "127.0.0.1:$PORT:8888")
[ -n "${GPUS:-}" ] && run+=(--gpus "$GPUS")
trap '"$DOCKER" rm --force "$NAME" > /dev/null 2>&1 || true' EXIT
"$DOCKER" "${run[@]}" "$IMAGE" > /dev/null
say "started $NAME (docker ${run[*]} $IMAGE)"

# inside CODE: python in the container, with the token in its environment.
inside() { "$DOCKER" exec --interactive "$NAME" python -; }

# 1. JupyterLab answers with its token, and only with it.
start=$SECONDS
until inside > /dev/null 2>&1 << 'EOF'; do
import urllib.request
urllib.request.urlopen("http://127.0.0.1:8888/api", timeout=2)
EOF
    [ "$("$DOCKER" inspect --format "{{.State.Running}}" "$NAME")" = true ] ||
        fail "the container stopped: $("$DOCKER" logs --tail 20 "$NAME" 2>&1)"
    [ $((SECONDS - start)) -lt 180 ] || fail "JupyterLab did not answer within 180 s"
    sleep 2
done
say "JupyterLab answers after $((SECONDS - start)) s"
inside << 'EOF' || fail "token check"
import json, os, urllib.error, urllib.request
base = "http://127.0.0.1:8888"
try:
    urllib.request.urlopen(base + "/api/status", timeout=5)
    raise SystemExit("/api/status answered without the token")
except urllib.error.HTTPError as e:
    assert e.code == 403, e.code
token = os.environ["JUPYTER_TOKEN"]
request = urllib.request.Request(base + "/api/status", headers={"Authorization": "token " + token})
status = json.load(urllib.request.urlopen(request, timeout=5))
page = urllib.request.urlopen(f"{base}/lab?token={token}", timeout=10)
body = page.read().decode()
assert page.status == 200 and "JupyterLab" in body, page.status
print(f"without the token: 403; with it: /api/status {status}, /lab {page.status}")
EOF
if [ "$RUN_NETWORK" = bridge ]; then
    code=$(curl --silent --output /dev/null --write-out '%{http_code}' \
        --header "Authorization: token $JUPYTER_TOKEN" "http://127.0.0.1:$PORT/api/status")
    [ "$code" = 200 ] || fail "http://127.0.0.1:$PORT/api/status from the host: $code"
    say "from the host: http://127.0.0.1:$PORT/api/status 200 with the token"
fi

# 2. The HEALTHCHECK (first run after its 30 s interval).
start=$SECONDS
while :; do
    health=$("$DOCKER" inspect --format '{{.State.Health.Status}}' "$NAME")
    [ "$health" = healthy ] && break
    [ "$health" = unhealthy ] && fail "unhealthy: $("$DOCKER" inspect --format \
        '{{range .State.Health.Log}}{{.Output}}{{end}}' "$NAME")"
    [ $((SECONDS - start)) -lt 180 ] || fail "still $health after 180 s"
    sleep 3
done
say "health: $health after $((SECONDS - start)) s more: $("$DOCKER" inspect --format \
    '{{(index .State.Health.Log 0).Output}}' "$NAME" | tr -d '\n')"
if "$DOCKER" inspect --format '{{json .State.Health}}' "$NAME" | grep -qF "$JUPYTER_TOKEN"; then
    fail "the token shows in docker inspect's health log"
fi

# 3. A 2-rank lk.launch with an all_reduce.
start=$SECONDS
inside << 'EOF' || fail "lk.launch"
import labkit as lk
import torch
import torch.distributed as dist


def ranksum(rank, world_size):
    t = torch.tensor([float(rank + 1)], device=lk.get_device())
    dist.all_reduce(t)
    return t.item(), dist.get_backend(), str(t.device)


results = lk.launch(ranksum, world_size=2)
assert [r[0] for r in results] == [3.0, 3.0], results
print(f"lk.launch world_size=2 all_reduce: {results} (torch {torch.__version__}, "
      f"CUDA build {torch.version.cuda}, GPUs seen {torch.cuda.device_count()})")
EOF
say "lk.launch took $((SECONDS - start)) s"

# 4. The learner extends the venv; 5. no dev tools in the learners' image.
"$DOCKER" exec --interactive "$NAME" bash -s << 'EOF' || fail "venv"
set -euo pipefail
[ "$(id -u)" != 0 ] || { echo "runs as root" >&2; exit 1; }
pkg=$(mktemp -d)
mkdir "$pkg/smoke_extra"
echo 'WHO = "learner"' > "$pkg/smoke_extra/__init__.py"
printf '[project]\nname = "smoke-extra"\nversion = "1"\n' > "$pkg/pyproject.toml"
pip install --quiet --no-index --no-build-isolation "$pkg"
python -c 'import smoke_extra, sys; print(f"{sys.prefix} extended by uid", __import__("os").getuid())'
pip uninstall --quiet --yes smoke-extra
python -c '
import importlib.util as u
dev = [m for m in ("pytest", "ruff", "nbval", "playwright") if u.find_spec(m)]
assert not dev, f"dev tools in the image: {dev}"
print("no dev tools (pytest, ruff, nbval, playwright)")'
EOF
say "PASSED: $IMAGE"
