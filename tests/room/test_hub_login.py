"""The room's hub takes logins (in the default suite, about 10 s).

docker/room/jupyterhub_config.py under the pinned JupyterHub and NativeAuthenticator (a pair
that must agree: NativeAuthenticator 1.3.0 cannot log anyone in on JupyterHub 6), started for
a roster of two learners without starting any server: the sign-up and login forms over HTTP,
an API token, and what is refused. The whole room runs in test_room.py (``make room-test``).
"""

from __future__ import annotations

import json

import pytest

from tests.room.client import Learner
from tests.room.hub import missing, running_room

pytestmark = pytest.mark.timeout(300)


def test_roster_learners_sign_up_and_log_in_and_nobody_else_does():
    why = missing()
    if why:
        pytest.skip(why)
    with running_room(2, isolated=False) as room:
        ann = Learner(room.url, "lkroom1", room.passwords["lkroom1"])
        assert ann.sign_up().startswith("The signup was successful")
        assert not Learner(room.url, "lkroom1", "not-the-password-42").log_in()
        assert ann.log_in()
        ann.make_token()
        code, raw = ann.request("GET", "hub/api/users/lkroom1")
        assert code == 200 and json.loads(raw)["servers"] == {}
        code, _ = ann.request("GET", "hub/api/users/lkroom2")  # another learner's record
        assert code in (403, 404)
        # A name off the roster can fill in the form, but the hub lets it in nowhere.
        stranger = Learner(room.url, "mallory", "a-long-password-9")
        stranger.sign_up()
        assert not stranger.log_in()
        # The second learner has not signed up: no password works yet.
        assert not Learner(room.url, "lkroom2", room.passwords["lkroom2"]).log_in()
