"""Issue 13/14's settings through the `/video` API of a running app (gradio_client, the tiny preset): a timed prompt
runs and a malformed one is refused naming the field; a video to extend is taken and recorded; the server keeps
serving after each refusal."""
from __future__ import annotations

import pytest

from tests.server_helpers import job_info

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_original):
    from tests.server_helpers import launched

    with launched(tmp_path_factory.mktemp("outputs"), tiny_original) as s:
        yield s


@pytest.fixture()
def client(server, tmp_path):
    c = server.client(tmp_path / "downloads")
    yield c
    c.close()


def test_a_timed_prompt_through_the_api(server, client, tmp_path):
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    from tests.conftest import make_image

    make_image(96, 80).save(tmp_path / "start.png")
    values = dict(image=handle_file(str(tmp_path / "start.png")), seconds=2.2, steps=2, api_name="/video")
    before = set(server.jobs())
    with pytest.raises(AppError, match="^prompt: the times must increase"):
        client.predict(prompt="[1s: a cat] [0s: a dog]", **values)            # unsorted times
    assert set(server.jobs()) == before                                        # refused before a job folder
    _, summary = client.predict(prompt="[0s: a cat sits] [1.2s: the cat jumps]", **values)
    assert summary["status"] == "done"
    info = job_info(server.outputs / summary["job_id"])
    assert info["settings"]["prompt"] == "[0s: a cat sits] [1.2s: the cat jumps]" and len(info["sections"]) == 2


def test_a_video_to_extend_through_the_api(server, client, tmp_path):
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    from common.files import file_sha256
    from tests.test_extend import moving_frames, write_video

    clip = write_video(tmp_path / "clip.mp4", moving_frames(45, 96, 80))
    values = dict(input_video=handle_file(str(clip)), prompt="the camera keeps moving", seconds=1.2,
                  steps=2, api_name="/video")
    with pytest.raises(AppError, match="original"):                           # the original mode cannot continue
        client.predict(mode="original", **values)
    _, summary = client.predict(mode="f1", **values)
    assert summary["status"] == "done", summary
    source = job_info(server.outputs / summary["job_id"])["source"]
    assert source["kind"] == "video" and source["sha256"] == file_sha256(clip) and source["frames"] == 45
