"""Who sees what (ui/access.py) and what a client may name as a file (ui/settings.py client_file): pure checks, no
server."""
from __future__ import annotations

import json

import pytest

from common.errors import InputError
from tests.conftest import make_image, uploaded
from ui import settings as st
from ui.access import Access


def _job(outputs, name, owner=None):
    d = outputs / name
    d.mkdir(parents=True)
    (d / "job.json").write_text(json.dumps({"status": "done", **({"owner": owner} if owner else {})}))
    return d


def test_owners_admins_and_the_single_user(tmp_path):
    alice = _job(tmp_path, "20250101-000000-aaaaaa", "alice")
    _job(tmp_path, "20250101-000000-bbbbbb", "bob")
    old = _job(tmp_path, "20250101-000000-cccccc")                # made before the logins
    nobody = Access()
    assert nobody.sees(None, "alice") and nobody.sees(None, None) and nobody.user(object()) is None
    two = Access.of([("alice", "1"), ("bob", "2"), ("carol", "3")], ["carol"])
    assert two.sees("alice", "alice") and not two.sees("bob", "alice") and not two.sees("alice", None)
    assert two.sees("carol", "alice") and two.sees("carol", None) and not two.sees("", "")
    assert two.job_folder(tmp_path, alice.name, "alice", "job") == alice
    for user, job_id in (("bob", alice.name), ("alice", old.name), ("alice", "../" + alice.name),
                         ("alice", ".queue"), ("alice", None), ("alice", ["x"])):
        with pytest.raises(InputError, match="^job: there is no job"):
            two.job_folder(tmp_path, job_id, user, "job")
    one = Access.of([("me", "pw")])
    assert one.sees("me", None) and one.sees("me", "alice")         # the only user sees everything


def test_a_client_names_only_its_uploads(tmp_path):
    picture = tmp_path / "p.png"
    make_image(64, 64).save(picture)
    upload = uploaded(picture)
    assert st.client_file({"path": upload, "meta": {"_type": "gradio.FileData"}}, "image") == upload
    assert st.client_file({"video": {"path": upload}}, "video") == upload
    assert st.client_file(None, "image") is None and st.client_file({"path": None}, "image") is None
    link = tmp_path / "link.png"
    escape = (st.upload_folder() / f"escape-{tmp_path.name}.png")
    escape.symlink_to(picture)                      # a link in the upload folder that leaves it
    try:
        refused = []
        for value in (str(picture), {"path": str(picture)}, {"path": str(tmp_path / "missing.png")}, str(escape),
                      {"path": upload + "/.."}, {"path": 5}, 7, ["x"], {"path": "\x00"}, str(link)):
            with pytest.raises(InputError) as e:
                st.client_file(value, "image")
            refused.append(e.value.message)
        assert len(set(refused)) == 1 and "uploaded" in refused[0]      # one answer, whatever is there
    finally:
        escape.unlink()
