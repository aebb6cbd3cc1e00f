"""app.py's command line (configs/options.py, ui/launch.py): safe defaults, warnings, --auth parsing, launch
options, the one Config."""
from __future__ import annotations

from pathlib import Path

import pytest

from configs import MEMORY
from configs.options import parse_auth
from ui.launch import is_local_host, launch_options, parse_args, security_warnings


def test_defaults_bind_localhost_only():
    config = parse_args([])
    assert config.web.host == "127.0.0.1"
    assert config.preset == "hunyuan"
    assert config.web.share is False and config.web.auth == () and config.web.port is None
    assert config.vram_cap_gb == MEMORY.vram_cap_gb
    assert config.outputs == Path("outputs")
    assert security_warnings(config) == []


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_local_hosts_give_no_warning(host):
    assert is_local_host(host)
    assert security_warnings(parse_args(["--host", host])) == []


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.20", "::", "myserver.lan"])
def test_non_local_host_warns(host):
    warnings = security_warnings(parse_args(["--host", host]))
    assert len(warnings) == 1 and host in warnings[0] and "--auth" in warnings[0]


def test_share_warns_and_mentions_auth_only_without_it():
    w = security_warnings(parse_args(["--share"]))
    assert len(w) == 1 and "public" in w[0] and "--auth" in w[0]
    w = security_warnings(parse_args(["--share", "--auth", "a:b"]))
    assert len(w) == 1 and "--auth" not in w[0]


def test_server_alias_of_the_original_app():
    assert parse_args(["--server", "0.0.0.0"]).web.host == "0.0.0.0"


def test_auth_parsing():
    assert parse_auth(None) is None
    assert parse_auth("alice:s3cret") == ("alice", "s3cret")
    assert parse_auth("alice:pa:ss") == ("alice", "pa:ss")
    for bad in ("alice", ":pw", "alice:", ""):
        with pytest.raises(ValueError):
            parse_auth(bad)
    assert parse_args(["--auth", "u:p"]).web.auth == (("u", "p"),)
    config = parse_args(["--auth", "a:1", "--auth", "b:2", "--admin", "b"])
    assert config.web.auth == (("a", "1"), ("b", "2")) and config.web.admins == ("b",)


@pytest.mark.parametrize("argv", [["--auth", "nopassword"], ["--vram-cap-gb", "0"], ["--port", "70000"],
                                  ["--preset", "nope"], ["--auth", "a:1", "--auth", "a:2"],
                                  ["--auth", "a:1", "--admin", "b"], ["--preset", "tiny", "--model-dir", "/m"]])
def test_bad_arguments_exit_with_usage(argv, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2


def test_launch_options(tmp_path):
    args = parse_args(["--preset", "tiny", "--port", "7999", "--outputs", str(tmp_path / "out"), "--auth", "u:p",
                       "--inbrowser"])
    kw = launch_options(args).kwargs()
    assert kw["server_name"] == "127.0.0.1" and kw["server_port"] == 7999
    assert kw["auth"] == [("u", "p")] and kw["inbrowser"] is True and kw["share"] is False
    assert kw["allowed_paths"] == [] and kw["blocked_paths"] == [str((tmp_path / "out").resolve())]
    assert kw["max_file_size"]


def test_a_port_in_use_is_named_with_the_apps_own_option():
    """Issue 33 item 9: Gradio's traceback advised GRADIO_SERVER_PORT or `server_port`; the app says --port."""
    import socket

    from ui.launch import port_problem

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        problem = port_problem("127.0.0.1", port)
        assert problem.startswith(f"--port {port}: cannot listen") and "leave --port out" in problem
        assert "GRADIO_SERVER_PORT" not in problem and "server_port" not in problem
    assert port_problem("127.0.0.1", port) is None and port_problem("127.0.0.1", None) is None


@pytest.mark.parametrize("argv, words", [
    (["--temp-max-age", "0"], "--temp-max-age: must be at least 1 second"),
    (["--host-ram-gb", "0"], "--host-ram-gb: must be more than 0"),
    (["--port", "0"], "--port: must be between 1 and 65535"),
    (["--auth", "a:1", "--admin", "b"], "--admin: 'b' is not a user of --auth; give --auth b:PASSWORD too"),
])
def test_bad_arguments_say_which_option_and_why_in_one_line(argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and words in err and len(err.strip().splitlines()) == 1, err


def test_outputs_inside_a_file_is_refused_naming_the_file(tmp_path, capsys):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    with pytest.raises(SystemExit):
        parse_args(["--outputs", str(a_file / "outputs")])
    assert f"--out: {a_file} is a file, not a folder; give a folder" in capsys.readouterr().err
