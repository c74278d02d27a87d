"""The container images' entrypoint: ``python -m agent.container serve ARGS`` runs
``edgeagent serve ARGS`` (``coordinator serve`` alike) with the admin token, and TLS when
given, from a mounted secret or from files that environment variables name. Without a
token it refuses to start and says how to give one, or how to opt in to ``--insecure``.

Each file is the one its variable names, else the secret's file where it exists:
the token ``$EDGEAGENT_ADMIN_TOKEN_FILE`` or ``admin-token``, TLS
``$EDGEAGENT_TLS_CERT_FILE`` and ``$EDGEAGENT_TLS_KEY_FILE`` or ``tls.crt`` and
``tls.key`` (a Kubernetes TLS Secret's keys), in ``/run/secrets/edgeagent``
(``$EDGEAGENT_SECRETS_DIR``). What they give is written to a config file of its own
(``admin_token_file``, ``tls``) passed as ``--config`` before ARGS; a token without TLS
serves plain HTTP with the token required (``insecure: true``, said on stderr: terminate
TLS in front, or give the two files). ARGS with ``--config`` (the config names its
files) or ``--insecure`` (the operator's explicit choice) are passed on unchanged.

``python -m agent.container probe HOST:PORT/PATH`` is the images' HEALTHCHECK: the
health route over HTTP, else over HTTPS (the server's own certificate on loopback, not
verified).
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import tempfile
import urllib.request
from pathlib import Path

SECRETS_DIR = "/run/secrets/edgeagent"
#: config key -> (environment variable, file name in the secrets' folder)
FILES = {"admin_token_file": ("EDGEAGENT_ADMIN_TOKEN_FILE", "admin-token"),
         "cert_file": ("EDGEAGENT_TLS_CERT_FILE", "tls.crt"),
         "key_file": ("EDGEAGENT_TLS_KEY_FILE", "tls.key")}


class Refused(Exception):
    """Why the container may not start as configured (the message says what to do)."""


def _how_to(secrets: str) -> str:
    return (
        "Give it an admin token (a file of 32 or more characters, e.g. "
        "`openssl rand -hex 32 > admin-token`), one of:\n"
        f"  - mount it at {secrets}/admin-token (docker run -v "
        f"\"$PWD/admin-token:{secrets}/admin-token:ro\" ...; in Kubernetes a Secret "
        f"mounted at {secrets});\n"
        "  - or name a file in EDGEAGENT_ADMIN_TOKEN_FILE;\n"
        f"  - and for HTTPS, tls.crt and tls.key beside it (or EDGEAGENT_TLS_CERT_FILE and "
        "EDGEAGENT_TLS_KEY_FILE);\n"
        "  - or pass --config FILE, a config with admin_token_file (or auth.token_file) "
        "and tls.\n"
        "To serve in the clear without a token anyway, say so: add --insecure to the "
        "command (docker run ... IMAGE --insecure). docs/operations.md, Docker.")


def found_files(env: dict[str, str]) -> dict[str, str]:
    """The config keys whose file is given: each variable that is set (its file must
    exist), else the secrets' folder's file where it exists."""
    secrets = Path(env.get("EDGEAGENT_SECRETS_DIR") or SECRETS_DIR)
    found = {}
    for key, (variable, name) in FILES.items():
        named = env.get(variable)
        if named:
            if not Path(named).is_file():
                raise Refused(f"{variable} names {named}: no such file")
            found[key] = named
        elif (secrets / name).is_file():
            found[key] = str(secrets / name)
    if ("cert_file" in found) != ("key_file" in found):
        given = found.get("cert_file") or found.get("key_file")
        raise Refused(f"TLS needs the certificate and its key, only {given} is given: give "
                      "both (EDGEAGENT_TLS_CERT_FILE and EDGEAGENT_TLS_KEY_FILE, or tls.crt "
                      f"and tls.key in {secrets})")
    return found


def container_config(found: dict[str, str]) -> dict:
    """The config that ``found`` files make: the token, and TLS or ``insecure``."""
    config: dict = {"admin_token_file": found["admin_token_file"]}
    if "cert_file" in found:
        config["tls"] = {"cert_file": found["cert_file"], "key_file": found["key_file"]}
    else:
        config["insecure"] = True
    return config


def command(args: list[str], env: dict[str, str], config_dir: Path | None = None
            ) -> tuple[list[str], str | None]:
    """(the ``edgeagent`` argv to run, a line for stderr or None) for the entrypoint's
    ``args``; ``Refused`` when it may not start. The config it makes is written under
    ``config_dir`` (a new private temporary folder when None)."""
    argv = ["edgeagent", *args]
    if "serve" not in args or {"--help", "-h", "--insecure"} & set(args):
        return argv, None
    secrets = env.get("EDGEAGENT_SECRETS_DIR") or SECRETS_DIR
    named = [v for v, _ in FILES.values() if env.get(v)]
    if any(a == "--config" or a.startswith("--config=") for a in args):
        if named:
            raise Refused(f"{', '.join(named)} given with --config: name the files in the "
                          "config instead (admin_token_file, tls.cert_file, tls.key_file)")
        return argv, None
    found = found_files(env)
    if "admin_token_file" not in found:
        if "cert_file" in found:
            raise Refused("TLS files but no admin token: anyone reaching the port would "
                          "have the admin API.\n" + _how_to(secrets))
        raise Refused("no admin token: anyone reaching the container's port would have "
                      "the admin API.\n" + _how_to(secrets))
    config = container_config(found)
    folder = config_dir or Path(tempfile.mkdtemp(prefix="edgeagent-container-"))
    path = folder / "container.yaml"
    path.write_text(json.dumps(config, indent=1) + "\n")  # JSON is YAML
    at = args.index("serve") + 1
    where = "HTTPS" if "tls" in config else (
        "plain HTTP (no tls.crt/tls.key: terminate TLS in front of it, or give both)")
    line = f"edgeagent container: admin token from {found['admin_token_file']}; serving {where}"
    return ["edgeagent", *args[:at], "--config", str(path), *args[at:]], line


def probe(url: str, timeout: float = 4.0) -> None:
    """GET ``url`` (``host:port/path``) over HTTP, else HTTPS unverified; raises when
    neither answers 2xx."""
    try:
        urllib.request.urlopen(f"http://{url}", timeout=timeout).read()
    except OSError as plain:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        try:
            urllib.request.urlopen(f"https://{url}", timeout=timeout, context=context).read()
        except OSError:
            raise plain from None


def main(args: list[str]) -> int:
    if args[:1] == ["probe"] and len(args) == 2:
        try:
            probe(args[1])
        except OSError as exc:
            print(f"{args[1]}: {exc}", file=sys.stderr)
            return 1
        return 0
    try:
        argv, line = command(args, dict(os.environ))
    except Refused as exc:
        print(f"edgeagent container: refusing to start: {exc}", file=sys.stderr)
        return 2
    if line:
        print(line, file=sys.stderr, flush=True)
    os.execvp(argv[0], argv)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
