"""The dashboard pages the node agent and the coordinator serve at ``GET /``.

Plain HTML, CSS and scripts from ``agent/http/static`` (package data: an install carries
them): no build step, nothing fetched from elsewhere (a Content-Security-Policy of
``'self'`` holds the page to it). The page polls the server's own JSON API; where that
needs a token (a read token will do) the page asks for it and keeps it in the tab's
``sessionStorage``. The page and its files never need the token.

A shared leaf: ``agent.node.app`` and ``agent.coordinator.app`` call ``add_dashboard``.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

STATIC = Path(__file__).resolve().parent / "static"
#: What a dashboard may load: only this server (the API it polls, its own files).
_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; connect-src 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}


def is_dashboard_path(path: str) -> bool:
    """Whether ``path`` is the page or one of its files (never behind the token)."""
    return path == "/" or path.startswith("/static/")


def add_dashboard(app: web.Application, page: str) -> None:
    """Serve ``agent/http/static/<page>`` at ``GET /`` and the shared files at
    ``GET /static/<name>``. Files are read once, here."""
    files = {p.name: (p.read_bytes(), _TYPES[p.suffix]) for p in STATIC.iterdir()
             if p.suffix in _TYPES}
    if page not in files:
        raise FileNotFoundError(f"no dashboard page {page!r} in {STATIC}")

    def respond(name: str) -> web.Response:
        body, content_type = files[name]
        return web.Response(body=body, content_type=content_type, charset="utf-8",
                            headers=_HEADERS)

    async def index(request: web.Request) -> web.Response:
        return respond(page)

    async def static(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in files or name.endswith(".html"):
            raise web.HTTPNotFound(text=f"no dashboard file {name!r}")
        return respond(name)

    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", static)
