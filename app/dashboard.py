"""The dashboard's built files (``frontend/dist``, SPECDECK_DASHBOARD_DIR) at ``/``.

A file of the build is served as it is: Vite's content-hashed ``assets/*`` cached for good,
everything else (index.html first) revalidated on each load, so a new build shows at once.
Any other path falls back to ``index.html``: it is one of the dashboard's own client routes
(``/jobs/job_x``). The API's paths are left alone: the route does not match them, so an unknown
``/api/...`` is still the JSON 404, and a 405's Allow names only the API's methods."""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Match, Route
from starlette.types import Scope

from app.errors import APIError

# Everything the API itself answers under (the docs' own assets are under /docs).
API_PREFIXES = ("/api", "/v1", "/docs", "/redoc", "/openapi.json", "/metrics", "/healthz",
                "/readyz")
# Vite's output folder: content-hashed names, so a file there never changes.
ASSETS = "assets"
IMMUTABLE = "public, max-age=31536000, immutable"
REVALIDATE = "no-cache"
HOW_TO_BUILD = ("The dashboard is not built. Run `make install` with Node.js >= 20 on PATH, or "
                "`cd frontend && npm ci && npm run build`, then reload; the API itself is at "
                "/api and its documentation at /docs.")


def is_api_path(path: str) -> bool:
    return any(path == prefix or path.startswith(prefix + "/") for prefix in API_PREFIXES)


class DashboardRoute(Route):
    """GET and HEAD on every path outside :data:`API_PREFIXES`; mount it after every other
    route."""

    def __init__(self, directory: Path) -> None:
        super().__init__("/{path:path}", self.serve, methods=["GET", "HEAD"],
                         include_in_schema=False)
        self.directory = directory

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child = super().matches(scope)
        if match is not Match.NONE and is_api_path("/" + child["path_params"]["path"]):
            return Match.NONE, {}
        return match, child

    async def serve(self, request: Request) -> Response:
        root = self.directory.resolve()
        index = root / "index.html"
        if not index.is_file():
            raise APIError(404, HOW_TO_BUILD, code="dashboard_not_built")
        path: str = request.path_params["path"]
        try:
            file = (root / path).resolve()
            inside, found = file.is_relative_to(root), file.is_file()
        except (OSError, ValueError):  # a NUL, a name too long: no file, so a client route
            inside, found = True, False
        if not inside:  # "..", an absolute path, a link out of the build
            raise APIError(404, "No such file in the dashboard", code="not_found")
        if found:
            cache = IMMUTABLE if file.is_relative_to(root / ASSETS) else REVALIDATE
            return FileResponse(file, headers={"Cache-Control": cache})
        if path.split("/", 1)[0] == ASSETS:
            # A build's missing file, not a client route: HTML in its place would only fail
            # later in the browser, as a script or style sheet that does not parse.
            raise APIError(404, f"No file '{path}' in the dashboard's build", code="not_found")
        return FileResponse(index, headers={"Cache-Control": REVALIDATE})

