"""Security of the launched app: it binds 127.0.0.1; with --auth the page, its API, uploads and files refuse anyone
without the login and work with it (browser login form and gradio_client); files outside the app's folders are
never served."""
from __future__ import annotations

import http.cookiejar
import urllib.error
import urllib.parse
import urllib.request

import pytest

from tests.conftest import make_image
from tests.server_helpers import job_info, launched

USER, PASSWORD = "alice", "pa:ss w0rd"


def _status(opener, url, data: bytes | None = None, headers=None) -> int:
    try:
        with opener.open(urllib.request.Request(url, data=data, headers=headers or {}), timeout=20) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_auth_protects_the_page_and_the_api(tmp_path, tiny_original):
    from gradio_client import Client, handle_file
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
            Client(server.url, verbose=False)
        with pytest.raises(ValueError, match="Could not login"):
            Client(server.url, verbose=False, auth=(USER, "wrong"))

        # the page's login form, as the browser posts it
        jar = http.cookiejar.CookieJar()
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        wrong = urllib.parse.urlencode({"username": USER, "password": "nope"}).encode()
        assert _status(browser, base + "/login", wrong, form) == 400
        right = urllib.parse.urlencode({"username": USER, "password": PASSWORD}).encode()
        assert _status(browser, base + "/login", right, form) == 200
        assert _status(browser, base + "/config") == 200

        client = Client(server.url, verbose=False, auth=(USER, PASSWORD), download_files=str(tmp_path / "dl"))
        try:
            video, summary = client.predict(image=handle_file(str(tmp_path / "start.png")), seconds=1.2, steps=1,
                                            api_name="/video")
        finally:
            client.close()
        assert summary["status"] == "done" and job_info(server.outputs / summary["job_id"])["status"] == "done"

        # a job's video is served to the logged-in page only; nothing outside the app's folders is served at all
        final = server.outputs / summary["job_id"] / "final.mp4"
        file_url = base + "/gradio_api/file=" + urllib.parse.quote(str(final))
        assert _status(anonymous, file_url) in (401, 403)
        assert _status(browser, file_url) == 200
        assert _status(browser, base + "/gradio_api/file=/etc/passwd") in (403, 404)
        assert _status(browser, base + "/gradio_api/file=" + urllib.parse.quote(str(tmp_path / "start.png"))) \
            in (403, 404)
