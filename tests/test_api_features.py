"""Issue 13/14's settings through the `/video` API of a running app (gradio_client, the tiny preset): a timed prompt
runs and a malformed one is refused naming the field; a video to extend is taken and recorded; the server keeps
serving after each refusal."""
from __future__ import annotations

import pytest

from tests.server_helpers import job_info

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


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
    from tests.extend_helpers import moving_frames, write_video

    clip = write_video(tmp_path / "clip.mp4", moving_frames(45, 96, 80))
    values = dict(input_video=handle_file(str(clip)), prompt="the camera keeps moving", seconds=1.2,
                  steps=2, api_name="/video")
    with pytest.raises(AppError, match="context frames"):                     # out of range: refused, named
        client.predict(mode="f1", context_frames=20, **values)
    _, summary = client.predict(mode="f1", **values)
    assert summary["status"] == "done", summary
    source = job_info(server.outputs / summary["job_id"])["source"]
    assert source["kind"] == "video" and source["sha256"] == file_sha256(clip) and source["frames"] == 45


def test_sizes_through_the_api(tiny_original, tmp_path):
    """Under a 6.5 GB cap (the tiny models at 2048×2048 need ≈ 7.4 GB): a custom size over the cap is refused naming
    the field and the nearest size that fits, with nothing written; a custom size that fits gives frames of it."""
    import av
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    from tests.conftest import make_image
    from tests.server_helpers import launched

    make_image(96, 80).save(tmp_path / "start.png")
    values = dict(image=handle_file(str(tmp_path / "start.png")), prompt="a cat", seconds=1.2, steps=2,
                  api_name="/video")
    with launched(tmp_path / "outputs", tiny_original, "--vram-cap-gb", "6.5") as server:
        client = server.client(tmp_path / "downloads")
        try:
            refused = r"^custom width: 2048×2048 cannot fit.*nearest size of the same shape that fits is"
            with pytest.raises(AppError, match=refused):
                client.predict(width=2048, height=2048, **values)
            assert server.jobs() == []
            video, summary = client.predict(width=96, height=64, **values)
            assert summary["status"] == "done"
            with av.open(str(server.outputs / summary["job_id"] / "final.mp4")) as c:
                stream = c.streams.video[0]
                assert (stream.width, stream.height) == (96, 64)
        finally:
            client.close()
