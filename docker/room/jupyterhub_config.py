# JupyterHub for a workshop room on one box: a server per learner, real logins, GPUs assigned,
# limits per learner, idle servers culled, TLS. docker/room/README.md explains every setting.
#
#   docker compose -f docker/room/compose.room.yaml up -d          # the room (DockerSpawner)
#   LABKIT_ROOM_SPAWNER=local jupyterhub -f docker/room/jupyterhub_config.py   # tests/room/
#
# Everything an instructor changes is an environment variable (compose.room.yaml passes them):
#   LABKIT_ROOM_LEARNERS   roster, "alice,bob,...": only these names (and the admin) get in;
#                          each signs up once, choosing a password. Without a roster, any name
#                          signs up and waits for the admin at /hub/authorize
#   LABKIT_ROOM_ADMIN      the instructor's user name (default "instructor")
#   LABKIT_ROOM_OPEN_SIGNUP=1   anyone who signs up is let in (a closed network only)
#   LABKIT_ROOM_GPU_IDS    the box's GPUs, "0,1,2,3,4,5,6,7" (default none: CPU-only learners)
#   LABKIT_ROOM_SIZE       learners expected (GPUs per learner = GPUs // size, at least 1)
#   LABKIT_ROOM_GPUS_PER_LEARNER   or say it directly
#   LABKIT_ROOM_GPU_TABLE  "alice=0,1; bob=2": these learners get exactly these GPUs
#   LABKIT_ROOM_CPUS, LABKIT_ROOM_MEMORY, LABKIT_ROOM_SHM   per learner (default 2, 8G, 2g)
#   LABKIT_ROOM_TIMEOUT_SCALE   labkit's deadlines x this (default: size x cpus / the box's cores)
#   LABKIT_ROOM_CULL_AFTER seconds of inactivity before a server is stopped (default 3600)
#   LABKIT_ROOM_TLS_CERT, LABKIT_ROOM_TLS_KEY   serve HTTPS with this certificate
#   LABKIT_ROOM_IMAGE, LABKIT_ROOM_NETWORK      the learners' image and Docker network
#   LABKIT_ROOM_DOCKER_TIMEOUT  seconds Docker's API may take to start a container (600)
#   LABKIT_ROOM_MEMLOCK    locked-memory limit per learner (-1: unlimited; empty: Docker's)
#   LABKIT_ROOM_DATA       the hub's state: database, cookie secret, seats (default ./data)
import json
import os
import pwd
import shutil
import sys
from importlib.util import module_from_spec, spec_from_file_location
from pathlib import Path

c = get_config()  # noqa: F821 - JupyterHub defines it when it loads this file

HERE = Path(__file__).resolve().parent
env = os.environ.get
MODE = env("LABKIT_ROOM_SPAWNER", "docker")  # docker: the room; local: tests on one machine
DATA = Path(env("LABKIT_ROOM_DATA", "data")).resolve()
DATA.mkdir(parents=True, exist_ok=True)


def _load_room():
    """labkit/room.py on its own (standard library only): the hub has no torch, no labkit."""
    for path in (HERE / "labkit_room.py", HERE.parents[1] / "labkit" / "room.py"):
        if path.exists():
            spec = spec_from_file_location("labkit_room", path)
            module = module_from_spec(spec)
            sys.modules["labkit_room"] = module  # dataclasses look their module up by name
            spec.loader.exec_module(module)
            return module
    raise FileNotFoundError("labkit/room.py: copy it next to this file as labkit_room.py")


room = _load_room()

# --- the hub: address, TLS, state ----------------------------------------------------------
c.JupyterHub.bind_url = env("LABKIT_ROOM_URL", "http://:8000")
if env("LABKIT_ROOM_TLS_CERT"):
    # HTTPS on the hub's own port; or leave these unset behind a TLS-terminating proxy.
    c.JupyterHub.ssl_cert = env("LABKIT_ROOM_TLS_CERT")
    c.JupyterHub.ssl_key = env("LABKIT_ROOM_TLS_KEY")
    c.JupyterHub.bind_url = env("LABKIT_ROOM_URL", "https://:8000")
c.JupyterHub.db_url = f"sqlite:///{DATA / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(DATA / "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.pid_file = str(DATA / "jupyterhub-proxy.pid")
c.JupyterHub.cleanup_servers = True  # stopping the hub stops the learners' servers

# --- who gets in: NativeAuthenticator (sign-up page, bcrypt passwords, lock-out) -------------
c.JupyterHub.authenticator_class = "nativeauthenticator.NativeAuthenticator"
ADMIN = env("LABKIT_ROOM_ADMIN", "instructor")
ROSTER = {n.strip() for n in env("LABKIT_ROOM_LEARNERS", "").split(",") if n.strip()}
c.Authenticator.admin_users = {ADMIN}
if ROSTER:
    # Roster names sign up and log in at once; the hub refuses every other name at login.
    c.Authenticator.allowed_users = ROSTER | {ADMIN}
    c.NativeAuthenticator.open_signup = True
else:
    # Any name may sign up; the admin lets each in at /hub/authorize (or open sign-up).
    c.Authenticator.allow_all = True
    c.NativeAuthenticator.open_signup = env("LABKIT_ROOM_OPEN_SIGNUP") == "1"
c.NativeAuthenticator.minimum_password_length = 8
c.NativeAuthenticator.check_common_password = True
c.NativeAuthenticator.allowed_failed_logins = 5
c.NativeAuthenticator.seconds_before_next_try = 60

# --- every learner's server ------------------------------------------------------------------
c.Spawner.default_url = "/lab"
CPUS = float(env("LABKIT_ROOM_CPUS") or 2)
ROOM_SIZE = int(env("LABKIT_ROOM_SIZE") or 8)
c.Spawner.cpu_limit = CPUS
c.Spawner.mem_limit = env("LABKIT_ROOM_MEMORY") or "8G"
# Everyone at work at once: the room's CPU share against the box's cores is how much slower
# than alone a learner's ranks run, so every labkit deadline stretches by it (lk.stretch).
SCALE = env("LABKIT_ROOM_TIMEOUT_SCALE") or f"{max(1.0, ROOM_SIZE * CPUS / os.cpu_count()):.1f}"
c.Spawner.environment = {"LABKIT_TIMEOUT_SCALE": SCALE}
# A loaded box starts servers slowly: the hub waits longer per server already running.
c.Spawner.start_timeout = int(env("LABKIT_ROOM_START_TIMEOUT", "300"))
c.Spawner.http_timeout = int(env("LABKIT_ROOM_HTTP_TIMEOUT", "180"))

GPU_IDS = [g.strip() for g in env("LABKIT_ROOM_GPU_IDS", "").split(",") if g.strip()]
TABLE = room.parse_table(env("LABKIT_ROOM_GPU_TABLE", ""))
if env("LABKIT_ROOM_GPUS_PER_LEARNER"):
    PER_LEARNER = int(env("LABKIT_ROOM_GPUS_PER_LEARNER"))
else:
    PER_LEARNER = room.per_learner_for(len(GPU_IDS), ROOM_SIZE)
SEATS = DATA / "room-seats.json"  # the learners in the order they first started a server


def seat_for(name: str):
    """This learner's GPUs; a learner seen before keeps theirs (labkit/room.py's rule)."""
    order = json.loads(SEATS.read_text()) if SEATS.exists() else []
    if name not in order:
        order.append(name)
        tmp = SEATS.with_suffix(".tmp")
        tmp.write_text(json.dumps(order))
        tmp.replace(SEATS)
    return room.assign_gpus(order, GPU_IDS, PER_LEARNER, TABLE)[name]


def log_seat(spawner, seat) -> None:
    spawner.log.info("room seat for %s: %s (%s)", seat.learner, seat.gpu_ids or "CPU", seat.how)


if MODE == "docker":
    # One container per learner from the course image: its own network namespace (so the
    # rendezvous store and gloo on its loopback are private), file system and /dev/shm.
    c.JupyterHub.spawner_class = "dockerspawner.DockerSpawner"
    c.JupyterHub.hub_ip = "0.0.0.0"  # the containers reach the hub on the room's network
    c.JupyterHub.hub_connect_ip = env("LABKIT_ROOM_HUB_HOST", "hub")
    c.DockerSpawner.image = env("LABKIT_ROOM_IMAGE", "labkit:room-learner")
    c.DockerSpawner.network_name = env("LABKIT_ROOM_NETWORK", "labkit-room")
    c.DockerSpawner.use_internal_ip = True
    # Docker's API may take minutes to start a container of a 6 GB image on a slow storage
    # driver (vfs: a full copy); the SDK's default of 60 s would fail the spawn.
    c.DockerSpawner.client_kwargs = {"timeout": int(env("LABKIT_ROOM_DOCKER_TIMEOUT") or 600)}
    c.DockerSpawner.remove = True  # a stopped server's container goes; its notebooks stay
    c.DockerSpawner.cmd = ["jupyterhub-singleuser"]
    NOTEBOOKS = "/home/learner/labkit/notebooks"
    c.DockerSpawner.notebook_dir = NOTEBOOKS
    # A named volume per learner: Docker fills a new volume with the image's notebooks, so each
    # learner edits their own copy, kept across restarts and culling.
    c.DockerSpawner.volumes = {"labkit-room-{username}": NOTEBOOKS}
    # NVIDIA's settings for PyTorch containers: unlimited locked memory (NCCL pins buffers) and
    # a 64 MB stack. LABKIT_ROOM_MEMLOCK="" keeps Docker's default, for a daemon not allowed to
    # raise it ("error setting rlimit type 8: operation not permitted").
    MEMLOCK = env("LABKIT_ROOM_MEMLOCK", "-1")
    HOST_CONFIG = {
        "shm_size": env("LABKIT_ROOM_SHM") or "2g",  # NCCL and torch share tensors in /dev/shm
        "ulimits": [{"name": "stack", "soft": 67108864, "hard": 67108864}]
        + ([{"name": "memlock", "soft": int(MEMLOCK), "hard": int(MEMLOCK)}] if MEMLOCK else []),
    }

    def pre_spawn(spawner) -> None:
        seat = seat_for(spawner.user.name)
        spawner.extra_host_config = {
            **HOST_CONFIG,
            "device_requests": room.device_requests(seat),  # only these GPUs, seen as 0..k-1
        }
        spawner.environment = {**spawner.environment, **room.seat_env(seat)}
        log_seat(spawner, seat)

elif MODE == "local":
    # Servers as local processes (tests/room/): LocalProcessSpawner with a system user per
    # learner, or SimpleLocalProcessSpawner (one user for all: no isolation, tests only).
    c.JupyterHub.spawner_class = env(
        "LABKIT_ROOM_LOCAL_SPAWNER", "jupyterhub.spawner.SimpleLocalProcessSpawner"
    )
    if env("LABKIT_ROOM_HUB_IP"):
        c.JupyterHub.hub_ip = env("LABKIT_ROOM_HUB_IP")
    # The hub's own venv serves the learners (by path: their PATH may hold folders they
    # cannot enter).
    c.Spawner.cmd = [str(Path(sys.executable).parent / "jupyterhub-singleuser")]
    c.SimpleLocalProcessSpawner.home_dir_template = str(DATA / "home" / "{username}")
    if os.geteuid() == 0 and c.JupyterHub.spawner_class.endswith("SimpleLocalProcessSpawner"):
        c.Spawner.args = ["--allow-root"]  # every server as the hub's user, root: tests only
    SOURCE = Path(env("LABKIT_ROOM_NOTEBOOKS", str(HERE.parents[1] / "notebooks")))

    def home_of(spawner) -> tuple[Path, int | None, int | None]:
        if hasattr(spawner, "home_dir"):  # SimpleLocalProcessSpawner: the hub's own user
            return Path(spawner.home_dir), None, None
        entry = pwd.getpwnam(spawner.user.name)
        return Path(entry.pw_dir), entry.pw_uid, entry.pw_gid

    def pre_spawn(spawner) -> None:
        home, uid, gid = home_of(spawner)
        notebooks = home / "notebooks"
        if not notebooks.exists():  # the learner's own copy, made once
            home.mkdir(parents=True, exist_ok=True)
            shutil.copytree(SOURCE, notebooks, ignore=shutil.ignore_patterns(".*"))
            if uid is not None:
                for path in (notebooks, *notebooks.rglob("*")):
                    os.chown(path, uid, gid)
        spawner.notebook_dir = str(notebooks)
        seat = seat_for(spawner.user.name)
        spawner.environment = {**spawner.environment, **room.seat_env(seat, True)}
        log_seat(spawner, seat)

else:
    raise ValueError(f"LABKIT_ROOM_SPAWNER={MODE!r}: docker or local")

c.Spawner.pre_spawn_hook = pre_spawn

# --- idle servers are stopped (their notebooks stay) ----------------------------------------
c.JupyterHub.load_roles = [
    {
        "name": "idle-culler",
        "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
        "services": ["idle-culler"],
    }
]
c.JupyterHub.services = [
    {
        "name": "idle-culler",
        "command": [
            sys.executable,
            "-m",
            "jupyterhub_idle_culler",
            f"--timeout={int(env('LABKIT_ROOM_CULL_AFTER', '3600'))}",
        ],
    }
]
