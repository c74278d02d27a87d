"""An agent's first contact with a coordinator that knows nodes by their own
credential: trade the one-time join token (``coordinator.join_token_file``) for this
node's report token, kept in ``coordinator.credential_file`` (mode 0600) and used from
then on (``report_token``)."""

from __future__ import annotations

import logging
from typing import Any

from agent.config import CoordinatorLink
from agent.security.credentials import read_token, write_secret
from agent.validation import load_json

log = logging.getLogger("edgeagent.reporter")


async def join(session: Any, link: CoordinatorLink, node: str) -> str:
    """POST /v1/join with the join token; this node's own token, written to
    ``credential_file`` (RuntimeError naming the coordinator's answer otherwise)."""
    if link.credential_file is None:
        raise RuntimeError("coordinator.join_token_file needs coordinator.credential_file "
                           "(where the node credential it brings is kept)")
    token = read_token(link.join_token_file)
    async with session.post(link.url.rstrip("/") + "/v1/join", json={"node": node},
                            headers={"Authorization": f"Bearer {token}"}) as resp:
        raw = await resp.read()
    try:
        answer = load_json(raw)
    except ValueError:
        answer = None
    if resp.status != 200 or not isinstance(answer, dict) \
            or not isinstance(answer.get("token"), str):
        message = answer.get("error") if isinstance(answer, dict) else resp.reason
        raise RuntimeError(f"joining the coordinator failed: {resp.status}: {message}")
    write_secret(link.credential_file, answer["token"])
    log.info("joined the coordinator as node %s; credential kept in %s", node,
             link.credential_file)
    return answer["token"]


async def report_token(session: Any, link: CoordinatorLink, node: str) -> str | None:
    """The token reports carry: the node credential once it exists, else one obtained
    by joining, else ``token_file``'s (None: no token)."""
    if link.credential_file is not None and link.credential_file.exists():
        return read_token(link.credential_file)
    if link.join_token_file is not None:
        return await join(session, link, node)
    return read_token(link.token_file)
