#!/usr/bin/python3 -I
"""The image's HEALTHCHECK: JupyterLab answers /api/status to the container's own token.

/api/status needs the token (the unauthenticated /api would only show that something answers
HTTP). The token comes from JUPYTER_TOKEN in the container's environment and goes in the
Authorization header: never on a command line, in the URL or in what this prints, which
`docker inspect` keeps. Standard library only, run by the system python3 (-I: no user site,
no PYTHON* variables), so that a learner's changes to the venv cannot break it.

In a workshop room (docker/room/) JupyterHub starts the server instead, with no JUPYTER_TOKEN:
there the check asks the single-user server under its prefix (JUPYTERHUB_SERVICE_PREFIX, e.g.
/user/alice/) with the server's own hub token (JUPYTERHUB_API_TOKEN), read the same way.

Usage: labkit-healthcheck [URL]    (default http://127.0.0.1:8888, the image's JupyterLab)
Exit 0 when healthy, 1 otherwise, with one line saying why.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request

DEFAULT_URL = "http://127.0.0.1:8888"


def check(base_url: str, token: str, timeout: float = 5.0) -> str:
    """One line about the server; raises on anything but a 200 with a status model."""
    request = urllib.request.Request(
        base_url.rstrip("/") + "/api/status", headers={"Authorization": f"token {token}"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        status = json.load(response)
    return f"JupyterLab up since {status['started']}, {status['kernels']} kernel(s)"


def main(argv: list[str]) -> int:
    token = os.environ.get("JUPYTER_TOKEN", "")
    prefix = ""
    if not token and os.environ.get("JUPYTERHUB_SERVICE_PREFIX"):
        token = os.environ.get("JUPYTERHUB_API_TOKEN", "")  # a room's single-user server
        prefix = os.environ["JUPYTERHUB_SERVICE_PREFIX"].rstrip("/")
    if not token:
        print("unhealthy: JUPYTER_TOKEN is not set, so no JupyterLab is served here")
        return 1
    url = (argv[1] if len(argv) > 1 else DEFAULT_URL).rstrip("/") + prefix
    try:
        print(check(url, token))
    except urllib.error.HTTPError as e:  # its message holds the URL only, never the header
        print(f"unhealthy: {url}/api/status answered {e.code} {e.reason}")
        return 1
    except (OSError, ValueError, KeyError) as e:
        print(f"unhealthy: {url}/api/status: {type(e).__name__}: {e}".replace(token, "***"))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
