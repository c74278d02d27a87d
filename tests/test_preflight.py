"""One validation for ``config check`` and the servers (issue 38): every config that
``serve`` (or ``coordinator serve``) refuses at start, ``config check`` refuses with the
same words, naming the file and the key; a file a key names that is missing reads
``FILE: KEY: no such file``, never a bare errno. The commands run through click's
runner: a refusal comes before anything listens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli import main
from tests.helpers import issue_cert, make_ca


def _run(*args: str) -> tuple[int, str]:
    done = CliRunner().invoke(main, list(args))
    return done.exit_code, done.output


@pytest.fixture
def base(tmp_path) -> dict:
    """A config that starts (loopback, an existing repository, ports no one takes)."""
    (tmp_path / "models").mkdir()
    return {"repository": str(tmp_path / "models"), "data_dir": str(tmp_path / "data"),
            "port": 0, "grpc_port": 0}


def _pki(tmp_path: Path) -> tuple:
    ca = make_ca(tmp_path)
    return ca, issue_cert(ca, tmp_path, "server")


CASES = {
    "missing admin token": (lambda t, p: {"admin_token_file": str(t / "admin-token")},
                            "{t}/admin-token: admin_token_file: no such file"),
    "short admin token": (lambda t, p: {"admin_token_file": str(_write(t / "tok", "short"))},
                          "admin_token_file: the token in token file"),
    "token file a directory": (lambda t, p: {"auth": {"token_file": str(t)}},
                               "{t}: auth.token_file: a directory, not a file"),
    "missing certificate": (lambda t, p: {"tls": {"cert_file": str(t / "nope.crt"),
                                                  "key_file": str(p[1].key_file)}},
                            "{t}/nope.crt: tls.cert_file: no such file"),
    "key of another certificate": (lambda t, p: {"tls": {"cert_file": str(p[1].cert_file),
                                                         "key_file": str(p[0].key_file)}},
                                   "tls.key_file: does not match tls.cert_file"),
    "missing repository": (lambda t, p: {"repository": str(t / "gone")},
                           "{t}/gone: repository: no such directory"),
    "exposed without TLS or token": (lambda t, p: {"host": "0.0.0.0"},
                                     "{file}: host: refusing to listen on 0.0.0.0"),
    "missing coordinator token": (
        lambda t, p: {"coordinator": {"url": "http://127.0.0.1:1",
                                      "token_file": str(t / "coordinator-token")}},
        "{t}/coordinator-token: coordinator.token_file: no such file"),
    "missing coordinator CA": (
        lambda t, p: {"coordinator": {"url": "https://127.0.0.1:1",
                                      "ca_file": str(t / "ca.crt")}},
        "{t}/ca.crt: coordinator.ca_file: no such file"),
}


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize("case", list(CASES))
def test_config_check_refuses_what_serve_refuses_in_the_same_words(tmp_path, base, case):
    change, expected = CASES[case]
    config = tmp_path / "agent.yaml"
    config.write_text(json.dumps({**base, **change(tmp_path, _pki(tmp_path))}))
    expected = expected.format(t=tmp_path, file=config)
    code, said = _run("config", "check", "agent", str(config))
    assert code == 1 and expected in said, said
    assert "Errno" not in said and said.count("\n") == 1, said
    code, started = _run("serve", "--config", str(config))
    assert code == 1 and said == started, (said, started)


def test_a_config_that_checks_ok_is_one_serve_accepts(tmp_path, base):
    ca, server = _pki(tmp_path)
    token = _write(tmp_path / "admin-token", "x" * 40)
    config = tmp_path / "agent.yaml"
    config.write_text(json.dumps({**base, "host": "0.0.0.0", "admin_token_file": str(token),
                                  "tls": {"cert_file": str(server.cert_file),
                                          "key_file": str(server.key_file)}}))
    assert _run("config", "check", "agent", str(config)) == (0, f"{config}: ok\n")
    from agent.commands.serve import build_config
    from agent.config.preflight import check_agent

    check_agent(build_config(str(config), {})[0], config)  # what serve runs: no error


def test_the_demo_needs_no_repository_yet(tmp_path):
    """Left out, the repository is the demo's, written at start: not a refusal."""
    config = tmp_path / "agent.yaml"
    config.write_text(json.dumps({"data_dir": str(tmp_path / "fresh")}))
    assert _run("config", "check", "agent", str(config))[0] == 0
    from agent.commands.serve import build_config
    from agent.config.preflight import check_agent

    config_, demo = build_config(str(config), {})
    assert demo and not config_.repository.exists()
    check_agent(config_, config, demo=True)


@pytest.mark.parametrize("change, expected", [
    ({"admin_token_file": "{t}/admin-token"}, "{t}/admin-token: admin_token_file: no such file"),
    ({"host": "0.0.0.0"}, "host: refusing to listen on 0.0.0.0"),
    ({"tls": {"cert_file": "{t}/c.crt", "key_file": "{t}/c.key"}},
     "{t}/c.crt: tls.cert_file: no such file"),
])
def test_the_coordinators_check_refuses_what_it_refuses(tmp_path, change, expected):
    config = tmp_path / "coordinator.yaml"
    config.write_text(json.dumps({"state_dir": str(tmp_path / "state"), "port": 0,
                                  **change}).replace("{t}", str(tmp_path)))
    expected = expected.format(t=tmp_path)
    code, said = _run("config", "check", "coordinator", str(config))
    assert code == 1 and expected in said, said
    code, started = _run("coordinator", "serve", "--config", str(config))
    assert code == 1 and said == started, (said, started)
