"""A learner's side of a room, over HTTP: sign up and log in through the hub's forms, start a
server, run code in a kernel over the server's WebSocket API.

What a browser does, without the browser: the hub's sign-up and login forms (with their
``_xsrf`` fields and cookies), an API token made with the login cookie, then the REST and
WebSocket APIs of the learner's own server with that token. Standard library plus
``websocket-client`` (a dependency of jupyter_server).
"""

from __future__ import annotations

import http.cookiejar
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a login's 302 is the answer, not something to follow


@dataclass
class Reply:
    """What one executed cell gave back."""

    status: str  # "ok" or "error"
    text: str  # stdout, stderr and text/plain results, in order
    error: str = ""  # "ename: evalue" and the traceback, for an error
    seconds: float = 0.0


class CellError(AssertionError):
    """A cell raised in the learner's kernel."""


@dataclass
class Learner:
    """One learner's browser-less session with the hub."""

    hub: str  # http://127.0.0.1:PORT/
    name: str
    password: str
    token: str = ""
    jar: http.cookiejar.CookieJar = field(default_factory=http.cookiejar.CookieJar)

    # -- HTTP ------------------------------------------------------------------------------
    def _opener(self, follow: bool = True) -> urllib.request.OpenerDirector:
        handlers = [urllib.request.HTTPCookieProcessor(self.jar)]
        if not follow:
            handlers.append(_NoRedirect())
        return urllib.request.build_opener(*handlers)

    def _xsrf(self) -> str:
        return next((c.value for c in self.jar if c.name == "_xsrf"), "")

    def request(
        self,
        method: str,
        path: str,
        body: dict | None = None,
        timeout: float = 60,
        form: bool = False,
        follow: bool = True,
    ) -> tuple[int, bytes]:
        """One request to ``hub + path``: the token when there is one, else the cookies."""
        headers = {}
        data = None
        if body is not None and form:
            data = urllib.parse.urlencode(body).encode()
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        elif body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"token {self.token}"
        elif method != "GET":
            headers["X-XSRFToken"] = self._xsrf()
        req = urllib.request.Request(self.hub + path, data=data, method=method, headers=headers)
        try:
            with self._opener(follow).open(req, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def _form(self, path: str) -> str:
        code, page = self.request("GET", path)
        assert code == 200, f"{self.name}: GET {path} -> {code}"
        m = re.search(rb'name="_xsrf" value="([^"]+)"', page)
        assert m, f"{self.name}: no _xsrf field in {path}"
        return m.group(1).decode()

    # -- the hub ---------------------------------------------------------------------------
    def sign_up(self) -> str:
        """The sign-up form (NativeAuthenticator); returns the page's message."""
        xsrf = self._form("hub/signup")
        body = {
            "_xsrf": xsrf,
            "username": self.name,
            "signup_password": self.password,
            "signup_password_confirmation": self.password,
        }
        code, page = self.request("POST", "hub/signup", body, form=True)
        assert code == 200, f"{self.name}: sign-up answered {code}"
        m = re.search(rb'class="alert [^"]*"[^>]*>\s*<p>\s*(.*?)\s*</p>', page, re.S)
        return " ".join(m.group(1).decode().split()) if m else ""

    def log_in(self, password: str | None = None) -> bool:
        """The login form; True when the hub set its login cookie (a 302 away from the form)."""
        xsrf = self._form("hub/login")
        body = {"_xsrf": xsrf, "username": self.name, "password": password or self.password}
        code, _ = self.request("POST", "hub/login", body, form=True, follow=False)
        return code == 302 and any(c.name.startswith("jupyterhub-hub-login") for c in self.jar)

    def make_token(self) -> None:
        """An API token for this learner, asked for with the login cookie."""
        body = {"note": "room test", "expires_in": 3600}
        code, raw = self.request("POST", f"hub/api/users/{self.name}/tokens", body)
        assert code in (200, 201), f"{self.name}: token -> {code} {raw[:200]!r}"
        self.token = json.loads(raw)["token"]

    def start_server(self, timeout: float) -> float:
        """Start this learner's server and wait until the hub says it is ready; seconds."""
        start = time.monotonic()
        code, raw = self.request("POST", f"hub/api/users/{self.name}/server", {})
        assert code in (201, 202), f"{self.name}: start -> {code} {raw[:300]!r}"
        while time.monotonic() - start < timeout:
            _, raw = self.request("GET", f"hub/api/users/{self.name}")
            server = json.loads(raw).get("servers", {}).get("")
            if server and server.get("ready"):
                return time.monotonic() - start
            if server is None and time.monotonic() - start > 5:  # the spawn failed
                raise RuntimeError(f"{self.name}: the hub gave up starting the server")
            time.sleep(0.5)
        raise TimeoutError(f"{self.name}: server not ready within {timeout:.0f} s")

    def stop_server(self, timeout: float = 60) -> None:
        self.request("DELETE", f"hub/api/users/{self.name}/server")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            _, raw = self.request("GET", f"hub/api/users/{self.name}")
            if not json.loads(raw).get("servers"):
                return
            time.sleep(0.5)

    # -- the learner's server ---------------------------------------------------------------
    def server(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
        return self.request(method, f"user/{self.name}/{path}", body)

    def kernel(self, cwd: str = "", timeout: float = 120) -> Kernel:
        """A new python3 kernel in this learner's server, started in the folder ``cwd``."""
        code, raw = self.server("POST", "api/kernels", {"name": "python3", "path": cwd})
        assert code == 201, f"{self.name}: kernel -> {code} {raw[:300]!r}"
        kid = json.loads(raw)["id"]
        ws = self.hub.replace("http", "ws", 1) + f"user/{self.name}/api/kernels/{kid}/channels"
        return Kernel(self, kid, ws, timeout)


class Kernel:
    """A kernel of a learner's server, driven over its WebSocket channels."""

    def __init__(self, learner: Learner, kid: str, url: str, timeout: float) -> None:
        import websocket

        self.learner, self.id = learner, kid
        self.session = uuid.uuid4().hex
        self.ws = websocket.create_connection(
            url, header=[f"Authorization: token {learner.token}"], timeout=timeout
        )

    def execute(self, code: str, timeout: float) -> Reply:
        """Run ``code``; wait for its reply and for the kernel to go idle."""
        import websocket

        msg_id = uuid.uuid4().hex
        header = {
            "msg_id": msg_id,
            "msg_type": "execute_request",
            "session": self.session,
            "username": self.learner.name,
            "version": "5.3",
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        content = {
            "code": code,
            "silent": False,
            "store_history": True,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
        }
        msg = {"header": header, "parent_header": {}, "metadata": {}, "content": content}
        self.ws.send(json.dumps({**msg, "channel": "shell"}))
        start = time.monotonic()
        text, error, status, idle = [], "", None, False
        while status is None or not idle:
            left = timeout - (time.monotonic() - start)
            if left <= 0:
                raise TimeoutError(
                    f"{self.learner.name}: no reply within {timeout:.0f} s to:\n{code[:300]}\n"
                    f"output so far:\n{''.join(text)[-2000:]}"
                )
            self.ws.settimeout(min(left, 30))
            try:
                reply = json.loads(self.ws.recv())
            except websocket.WebSocketTimeoutException:
                continue
            if reply.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, body = reply["header"]["msg_type"], reply["content"]
            if kind == "stream":
                text.append(body["text"])
            elif kind in ("execute_result", "display_data"):
                text.append(body.get("data", {}).get("text/plain", "") + "\n")
            elif kind == "error":
                error = f"{body['ename']}: {body['evalue']}\n" + "\n".join(body["traceback"])
            elif kind == "status" and body["execution_state"] == "idle":
                idle = True
            elif kind == "execute_reply":
                status = body["status"]
        return Reply(status, "".join(text), error, time.monotonic() - start)

    def run(self, code: str, timeout: float) -> str:
        """Run ``code``; its text, or CellError with the kernel's traceback."""
        reply = self.execute(code, timeout)
        if reply.status != "ok":
            raise CellError(f"{self.learner.name}: {reply.error}\ncell:\n{code[:500]}")
        return reply.text

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.learner.server("DELETE", f"api/kernels/{self.id}")
