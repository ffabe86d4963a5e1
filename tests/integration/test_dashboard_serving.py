"""The dashboard's build at ``/`` and the offline /docs and /redoc, over real HTTP from a real
``specdeck api``: files of the build as they are (hashed assets cached for good, index.html
revalidated), client routes answered with index.html, the API's own paths untouched (JSON 404
in the one error shape), no way out of the build's folder, and a helpful answer while nothing
is built. Swagger UI and ReDoc load nothing from another host."""

from __future__ import annotations

import http.client
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.conftest import ROOT
from tests.support.api_server import start_api, stop_api
from tests.support.errors import assert_error

INDEX = "<!doctype html><title>SpecDeck dashboard</title><script src=/assets/app-1a2b.js></script>"
SCRIPT = "console.log('dashboard')"
SECRET = "secret next to the build"


@contextmanager
def serving(dist: Path, sqlite_template: Path, roots: dict[str, str],
            tmp: Path) -> Iterator[str]:
    """A ``specdeck api`` serving ``dist`` as the dashboard; yields its URL."""
    db = tmp / "specdeck.db"
    shutil.copy(sqlite_template, db)
    env = {**os.environ, **roots, "PYTHONPATH": str(ROOT),
           "SPECDECK_DATABASE_URL": f"sqlite:///{db}",
           "SPECDECK_BROKER_URL": f"sqla+sqlite:///{tmp / 'broker.db'}",
           "SPECDECK_DASHBOARD_DIR": str(dist)}
    url, proc = start_api(env, tmp / "api.log")
    try:
        yield url
    finally:
        stop_api(proc)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path,
         roots: dict[str, str]) -> Iterator[tuple[str, Path]]:
    """A built dashboard (index.html, a hashed script, a favicon), a file beside the build's
    folder and a link to it inside; the URL of the API serving it."""
    tmp = tmp_path_factory.mktemp("dashboard")
    (tmp / "secret.txt").write_text(SECRET)
    dist = tmp / "dist"
    (dist / "assets").mkdir(parents=True)
    (dist / "index.html").write_text(INDEX)
    (dist / "assets" / "app-1a2b.js").write_text(SCRIPT)
    (dist / "favicon.svg").write_text("<svg xmlns='http://www.w3.org/2000/svg'/>")
    (dist / "link.txt").symlink_to(tmp / "secret.txt")
    with serving(dist, sqlite_template, roots, tmp) as url:
        yield url, tmp


def raw_get(url: str, target: str) -> tuple[int, str, str]:
    """GET with the request target sent exactly as written (no client normalizes its dots or
    percent escapes): status, Content-Type, body."""
    address = urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    try:
        connection.request("GET", target)
        response = connection.getresponse()
        return response.status, response.getheader("Content-Type", ""), response.read().decode()
    finally:
        connection.close()


@pytest.mark.parametrize("path", ["/", "/jobs/job_x", "/deployments/dep_1/chat", "/index.html",
                                  "/apix", "/documentation"])
def test_the_index_and_every_client_route_answer_index_html(site, path: str) -> None:
    url, _ = site
    response = httpx.get(url + path)
    assert response.status_code == 200, response.text
    assert response.text == INDEX
    assert response.headers["content-type"].startswith("text/html")
    assert response.headers["cache-control"] == "no-cache"


def test_built_files_are_served_as_they_are(site) -> None:
    url, _ = site
    script = httpx.get(url + "/assets/app-1a2b.js")
    assert script.status_code == 200 and script.text == SCRIPT
    assert script.headers["content-type"].startswith("text/javascript")
    assert script.headers["cache-control"] == "public, max-age=31536000, immutable"
    head = httpx.head(url + "/assets/app-1a2b.js")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == str(len(SCRIPT))
    icon = httpx.get(url + "/favicon.svg")  # not hashed: revalidated like index.html
    assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
    assert icon.headers["cache-control"] == "no-cache"


def test_a_missing_asset_is_a_404_not_the_index(site) -> None:
    url, _ = site
    assert_error(httpx.get(url + "/assets/app-0000.js"), 404, "not_found")


@pytest.mark.parametrize("method, path", [
    ("GET", "/api/nope"), ("GET", "/api"), ("GET", "/v1/nope"), ("GET", "/docs/nope"),
    ("GET", "/redoc/nope"), ("GET", "/healthz/nope"), ("GET", "/readyz/x"),
    ("GET", "/metrics/x"), ("GET", "/openapi.json/x"), ("HEAD", "/api/jobs/x/nope"),
])
def test_the_apis_unknown_paths_stay_json_404s(site, method: str, path: str) -> None:
    url, _ = site
    response = httpx.request(method, url + path)
    assert response.status_code == 404
    if method == "GET":
        assert_error(response, 404, "not_found")
    else:
        assert response.headers["content-type"] == "application/json"


def test_the_apis_own_answers_are_unchanged(site) -> None:
    url, _ = site
    assert httpx.get(url + "/healthz").json() == {"status": "ok"}
    assert httpx.get(url + "/openapi.json").json()["info"]["title"] == "SpecDeck"
    assert_error(httpx.get(url + "/api/jobs"), 401, "missing_api_key")
    # The dashboard takes GET and HEAD only, and answers any other method in the error shape.
    posted = assert_error(httpx.post(url + "/jobs/job_x", json={}), 405, "method_not_allowed")
    assert "GET, HEAD" in posted["message"]


@pytest.mark.parametrize("target", [
    "/../secret.txt", "/..%2fsecret.txt", "/%2e%2e/secret.txt", "/%2e%2e%2fsecret.txt",
    "/assets/..%2f..%2fsecret.txt", "/assets/%2e%2e/%2e%2e/secret.txt", "/link.txt",
    "/..%2f..%2f..%2f..%2f..%2f..%2f..%2fetc/passwd",
])
def test_no_path_leads_out_of_the_build(site, target: str) -> None:
    url, _ = site
    status, _, body = raw_get(url, target)
    assert SECRET not in body and "root:" not in body
    assert status == 404, body
    assert_error(httpx.Response(status, content=body), 404, "not_found")


def test_an_absolute_path_leads_nowhere(site) -> None:
    url, tmp = site
    status, _, body = raw_get(url, "/" + str(tmp / "secret.txt"))  # "//tmp/.../secret.txt"
    assert SECRET not in body
    assert_error(httpx.Response(status, content=body), 404, "not_found")


@pytest.mark.parametrize("target", ["/jobs/a%00b", "/jobs/" + "x" * 300])
def test_a_name_no_file_can_have_is_a_client_route(site, target: str) -> None:
    url, _ = site
    status, content_type, body = raw_get(url, target)
    assert (status, body) == (200, INDEX)
    assert content_type.startswith("text/html")


def test_with_no_build_the_answer_says_how_to_build_it_and_the_api_runs(
        tmp_path: Path, sqlite_template: Path, roots: dict[str, str]) -> None:
    dist = tmp_path / "dist"
    with serving(dist, sqlite_template, roots, tmp_path) as url:
        for path in ("/", "/jobs/job_x"):
            error = assert_error(httpx.get(url + path), 404, "dashboard_not_built")
            assert "make install" in error["message"]
            assert "npm ci && npm run build" in error["message"]
        assert httpx.get(url + "/healthz").status_code == 200
        assert httpx.get(url + "/docs").status_code == 200
        # Built while the API runs: served from the next request on.
        dist.mkdir()
        (dist / "index.html").write_text(INDEX)
        assert httpx.get(url + "/jobs/job_x").text == INDEX


def referenced(html: str) -> list[str]:
    return re.findall(r'(?:src|href)="([^"]+)"', html)


@pytest.mark.parametrize("page, title, files, defined", [
    ("/docs", "SpecDeck - Swagger UI", {"swagger-ui-bundle.js", "swagger-ui.css", "favicon.png"},
     "SwaggerUIBundle"),
    ("/redoc", "SpecDeck - ReDoc", {"redoc.standalone.js", "favicon.png"}, "Redoc"),
])
def test_the_docs_load_nothing_from_another_host(site, page: str, title: str, files: set[str],
                                                 defined: str) -> None:
    url, _ = site
    response = httpx.get(url + page)
    assert response.status_code == 200 and f"<title>{title}</title>" in response.text
    html = response.text
    assert "://" not in html  # no CDN, no Google Fonts, no external favicon
    assets = referenced(html)
    assert {Path(asset).name for asset in assets} == files
    for asset in assets:
        assert asset.startswith("/") and not asset.startswith("//"), asset
        loaded = httpx.get(url + asset)
        assert loaded.status_code == 200, asset
        kind = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}[Path(asset).suffix]
        assert loaded.headers["content-type"].startswith(kind), asset
    # The scripts are the real bundles: they define what the page calls.
    scripts = "".join(httpx.get(url + a).text for a in assets if a.endswith(".js"))
    assert defined in scripts
    assert len(scripts) > 500_000


def test_swagger_ui_sends_the_spec_to_no_online_validator(site) -> None:
    url, _ = site
    html = httpx.get(url + "/docs").text
    assert "url: '/openapi.json'" in html
    assert '"validatorUrl": null' in html  # else Swagger UI shows swagger.io's badge for it
