"""Security of the launched app: it binds 127.0.0.1; with --auth the page, its API, uploads and files refuse anyone
without the login and work with it (browser login form and gradio_client); files outside the app's folders are
never served."""
from __future__ import annotations

import http.cookiejar
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import make_image
from tests.server_helpers import api_client, job_info, launched

USER, PASSWORD = "alice", "pa:ss w0rd"


def _status(opener, url, data: bytes | None = None, headers=None) -> int:
    try:
        with opener.open(urllib.request.Request(url, data=data, headers=headers or {}), timeout=20) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_auth_protects_the_page_and_the_api(tmp_path, tiny_original):
    from gradio_client import handle_file
    from gradio_client.exceptions import AuthenticationError

    make_image(96, 80).save(tmp_path / "start.png")
    with launched(tmp_path / "outputs", tiny_original, "--auth", f"{USER}:{PASSWORD}") as server:
        base = server.url.rstrip("/")
        assert base.startswith("http://127.0.0.1:")
        anonymous = urllib.request.build_opener()
        assert _status(anonymous, base + "/") == 200                     # the login form
        for path in ("/config", "/gradio_api/info", "/gradio_api/queue/status"):
            assert _status(anonymous, base + path) == 401, path
        json_headers = {"Content-Type": "application/json"}
        assert _status(anonymous, base + "/gradio_api/call/video", b'{"data": []}', json_headers) == 401
        assert _status(anonymous, base + "/gradio_api/upload", b"--x--\r\n",
                       {"Content-Type": "multipart/form-data; boundary=x"}) == 401

        with pytest.raises(AuthenticationError):
            api_client(server.url)
        with pytest.raises(ValueError, match="Could not login"):
            api_client(server.url, auth=(USER, "wrong"))

        # the page's login form, as the browser posts it
        jar = http.cookiejar.CookieJar()
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        wrong = urllib.parse.urlencode({"username": USER, "password": "nope"}).encode()
        assert _status(browser, base + "/login", wrong, form) == 400
        right = urllib.parse.urlencode({"username": USER, "password": PASSWORD}).encode()
        assert _status(browser, base + "/login", right, form) == 200
        assert _status(browser, base + "/config") == 200

        client = api_client(server.url, tmp_path / "dl", auth=(USER, PASSWORD))
        try:
            video, summary = client.predict(image=handle_file(str(tmp_path / "start.png")), seconds=1.2, steps=1,
                                            api_name="/video")
        finally:
            client.close()
        assert summary["status"] == "done" and job_info(server.outputs / summary["job_id"])["status"] == "done"

        # a job's video is served to the logged-in page only, as the copy the app showed; the outputs folder
        # itself (its videos, job.json, the queue's database) and nothing outside the app's folders is served
        final = server.outputs / summary["job_id"] / "final.mp4"
        shown = base + "/gradio_api/file=" + urllib.parse.quote(_shown_copy(final))
        assert _status(anonymous, shown) in (401, 403)
        assert _status(browser, shown) == 200
        file_url = base + "/gradio_api/file=" + urllib.parse.quote(str(final))
        assert _status(anonymous, file_url) in (401, 403)
        assert _status(browser, file_url) == 403
        assert _status(browser, base + "/gradio_api/file=/etc/passwd") in (403, 404)
        assert _status(browser, base + "/gradio_api/file=" + urllib.parse.quote(str(tmp_path / "start.png"))) \
            in (403, 404)


def _shown_copy(path) -> str:
    """Where the app put the copy of an outputs file it showed (ui/media.py: Gradio's upload folder, by hash)."""
    from gradio.processing_utils import hash_file
    from gradio.utils import get_upload_folder

    return str(Path(get_upload_folder()) / hash_file(path) / Path(path).name)


def _login(base: str, user: str, password: str):
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    body = urllib.parse.urlencode({"username": user, "password": password}).encode()
    assert _status(opener, base + "/login", body, {"Content-Type": "application/x-www-form-urlencoded"}) == 200
    return opener


def test_each_user_sees_and_controls_only_their_own_jobs(tmp_path, tiny_original):
    """--auth for two users and an admin: neither user sees, resumes, extends, changes or downloads the other's
    jobs and queue entries; the admin sees everyone's."""
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    make_image(96, 80).save(tmp_path / "start.png")
    users = {"alice": "a-pass", "bob": "b-pass", "carol": "c-pass"}
    argv = [a for user, pw in users.items() for a in ("--auth", f"{user}:{pw}")] + ["--admin", "carol"]
    with launched(tmp_path / "outputs", tiny_original, *argv) as server:
        clients = {user: api_client(server.url, tmp_path / user, auth=(user, pw))
                   for user, pw in users.items()}
        alice, bob, carol = clients["alice"], clients["bob"], clients["carol"]
        try:
            video, done = alice.predict(image=handle_file(str(tmp_path / "start.png")), seconds=1.2, steps=1,
                                        mode="f1", api_name="/video")
            entry = alice.predict(image=handle_file(str(tmp_path / "start.png")), seconds=1.2, steps=1,
                                  prompt="alice's queued job", api_name="/queue_add")
            job_id = done["job_id"]
            assert job_info(server.outputs / job_id)["owner"] == "alice"

            def ids(client):
                return {e["id"] for e in client.predict(api_name="/queue_list")}

            def gallery(client):
                return len(client.predict(api_name="/refresh") or [])          # the Past jobs panel's pictures

            assert entry["id"] in ids(alice) and entry["id"] in ids(carol) and ids(bob) == set()
            assert gallery(alice) >= 1 and gallery(carol) >= 1 and gallery(bob) == 0
            for call in (dict(job_id=job_id, api_name="/resume"),
                         dict(job=entry["id"], api_name="/queue_remove"),
                         dict(job=entry["id"], position=0, api_name="/queue_move"),
                         dict(job=entry["id"], settings={"seconds": 2.4}, api_name="/queue_edit"),
                         dict(source_job=job_id, mode="f1", seconds=1.2, steps=1, api_name="/video")):
                with pytest.raises(AppError, match="there is no job"):
                    bob.predict(**call)
            assert ids(alice) >= {entry["id"]}                       # untouched
            # files: bob cannot fetch alice's; the outputs folder is not served to anyone
            base = server.url.rstrip("/")
            final = server.outputs / job_id / "final.mp4"
            for user in ("alice", "bob"):
                assert _status(_login(base, user, users[user]), base + "/gradio_api/file="
                               + urllib.parse.quote(str(final))) == 403
            assert _status(_login(base, "alice", users["alice"]), base + "/gradio_api/file="
                           + urllib.parse.quote(_shown_copy(final))) == 200
        finally:
            for client in clients.values():
                client.close()
