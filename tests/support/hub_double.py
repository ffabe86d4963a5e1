"""``HubDouble``: a TEST DOUBLE of the Hugging Face Hub's HTTP API. It is not the Hub.

The Hub cannot be reached from the test machines, so the publishing tests run the real
``huggingface_hub`` client (``HfApi(endpoint=double.url)``, or ``HF_ENDPOINT`` for a subprocess)
against this double. It is a real HTTP server (``http.server`` in a thread, 127.0.0.1, a free
port) that answers, at the HTTP level, the endpoints the installed client (huggingface_hub 2.x,
legacy LFS transfer, i.e. with Xet disabled) calls to create a repo and commit files to it:

====================================================  ============================================
``POST /api/repos/create``                            ``HfApi.create_repo`` (409 + url if it exists)
``GET  /api/models/{id}[/revision/{rev}]``            ``model_info`` / ``repo_info`` (``?blobs=true``)
``POST /api/models/{id}/paths-info/{rev}``            ``get_paths_info`` (form body, ``expand``)
``GET  /api/models/{id}/tree/{rev}[/{path}]``         ``list_repo_tree`` / ``list_repo_files``
``POST /api/validate-yaml``                           ``create_commit`` checks README.md metadata
``POST /api/models/{id}/preupload/{rev}``             upload mode (``lfs``/``regular``) + remote oid
``POST /{id}.git/info/lfs/objects/batch``             Git LFS batch API (basic and multipart)
``PUT  /lfs-storage/...`` (pre-signed, no bearer)     the object store the batch API points at
``POST /{id}.git/info/lfs/objects/verify``            LFS verify after the upload
``POST /api/models/{id}/commit/{rev}``                NDJSON commit: header / file / lfsFile lines
``GET  /api/whoami-v2``                               ``HfApi.whoami``
``GET  /{id}/resolve/{rev}/{path}``                   a file's content (``hf_hub_url``), with
                                                      ``X-Repo-Commit`` and ``ETag``; SpecDeck
                                                      reads a model's config.json this way
``GET  /api/agent-harnesses``                         fetched (no auth, once a day, cached in HF_HOME)
                                                      by the client to build its user-agent header
====================================================  ============================================

Authentication is checked like the Hub does it: a request that carries an
``Authorization: Bearer ...`` header with an unknown token gets 401 with
``X-Error-Message: Invalid credentials in Authorization header`` on every endpoint; write
endpoints need a known token with write access (403 otherwise) to a namespace the token's user
owns or belongs to. Upload URLs handed out by the batch API are "pre-signed": the client PUTs to
them without its token, as it does to S3 on the real Hub.

``seed(repo_id, {path: bytes})`` puts files in a public repo directly. ``stall_resolve()`` makes
file downloads hang until ``release_resolve()`` (a Hub that accepts connections and never
answers); ``resolving`` counts the downloads being held.

Everything received is stored so tests can inspect it: ``files()``, ``file_entries()``,
``commits()``, ``repo()``, ``lfs_objects()``, and ``requests`` (every request with its headers and
body, for scanning for leaked secrets). Requests that match no route are answered 404 and also
listed in ``unhandled``, so a test can assert the client called nothing the double does not model.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

INVALID_CREDENTIALS = "Invalid credentials in Authorization header"
REGULAR_FILE_MAX_BYTES = 10 * 1024 * 1024  # the Hub refuses non-LFS files above 10 MB

# What the Hub writes into a new model repo's first commit.
DEFAULT_GITATTRIBUTES = "".join(
    f"{pattern} filter=lfs diff=lfs merge=lfs -text\n"
    for pattern in (
        "*.7z", "*.arrow", "*.bin", "*.bz2", "*.ckpt", "*.ftz", "*.gz", "*.h5", "*.joblib",
        "*.lfs.*", "*.mlmodel", "*.model", "*.msgpack", "*.npy", "*.npz", "*.onnx", "*.ot",
        "*.parquet", "*.pb", "*.pickle", "*.pkl", "*.pt", "*.pth", "*.rar", "*.safetensors",
        "saved_model/**/*", "*.tar.*", "*.tar", "*.tflite", "*.tgz", "*.wasm", "*.xz", "*.zip",
        "*.zst", "*tfevents*",
    )
)


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob (what the Hub reports as a regular file's ``oid``)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@dataclass(frozen=True)
class StoredFile:
    """One file in a repo revision. For an LFS file the git blob is the pointer file."""

    path: str
    content: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()

    @property
    def size(self) -> int:
        return len(self.content)

    @property
    def pointer(self) -> bytes | None:
        return lfs_pointer(self.sha256, self.size) if self.lfs else None

    @property
    def blob_id(self) -> str:
        return git_blob_sha1(self.pointer if self.lfs else self.content)

    @property
    def remote_oid(self) -> str:
        """What preupload reports as ``oid``: the sha256 for LFS files, the git sha1 otherwise."""
        return self.sha256 if self.lfs else self.blob_id


@dataclass
class Commit:
    sha: str
    parent: str | None
    message: str
    description: str
    date: str
    author: str
    added: list[str]
    deleted: list[str]
    tree: dict[str, StoredFile]

    def summary(self) -> dict[str, Any]:
        return {
            "sha": self.sha, "parent": self.parent, "message": self.message,
            "description": self.description, "date": self.date, "author": self.author,
            "files": list(self.added), "deleted": list(self.deleted), "tree": sorted(self.tree),
        }


@dataclass
class Repo:
    repo_id: str
    private: bool
    created_at: str
    commits: list[Commit] = field(default_factory=list)
    lfs_objects: dict[str, bytes] = field(default_factory=dict)

    @property
    def head(self) -> Commit:
        return self.commits[-1]

    def resolve(self, revision: str) -> Commit | None:
        if revision == "main":
            return self.head
        for commit in self.commits:
            if commit.sha == revision:
                return commit
        return None


@dataclass
class RecordedRequest:
    method: str
    path: str  # with the query string
    headers: list[tuple[str, str]]
    body: bytes
    status: int = 0
    response_headers: dict[str, str] = field(default_factory=dict)
    response_body: bytes = b""

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key.lower() == name.lower():
                return value
        return None

    def transcript(self) -> str:
        """The whole exchange (request line, headers and body, then the response's status, headers
        and body) except the request's Authorization header: what a test scans for a leaked token."""
        headers = "\n".join(f"{k}: {v}" for k, v in self.headers if k.lower() != "authorization")
        response_headers = "\n".join(f"{k}: {v}" for k, v in self.response_headers.items())
        return (f"{self.method} {self.path}\n{headers}\n\n{self.body.decode('utf-8', 'replace')}\n"
                f"--> {self.status}\n{response_headers}\n\n{self.response_body.decode('utf-8', 'replace')}")


class HubError(Exception):
    def __init__(self, status: int, message: str, *, code: str | None = None, extra: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.extra = status, message, code, extra or {}


@dataclass
class _Caller:
    token: str | None
    user: str | None
    can_write: bool


class HubDouble:
    """A TEST DOUBLE of the Hugging Face Hub (see the module docstring). Use as a context manager::

        with HubDouble(token="hf_...") as hub:
            HfApi(endpoint=hub.url, token="hf_...").create_repo("specdeck-bot/x", private=True)
            hub.commits("specdeck-bot/x")
    """

    def __init__(
        self,
        *,
        token: str,
        user: str = "specdeck-bot",
        orgs: tuple[str, ...] = ("specdeck",),
        read_only_tokens: tuple[str, ...] = (),
        multipart_chunk_size: int | None = None,
        response_delay: float = 0.0,
    ) -> None:
        self._tokens: dict[str, bool] = {token: True, **{t: False for t in read_only_tokens}}
        self.user = user
        self.orgs = tuple(orgs)
        self.multipart_chunk_size = multipart_chunk_size  # objects larger than this go multipart
        self.response_delay = response_delay
        self.requests: list[RecordedRequest] = []
        self.unhandled: list[RecordedRequest] = []
        self._repos: dict[str, Repo] = {}
        self._signatures: dict[str, tuple[str, str, int]] = {}  # signature -> (repo, oid, size)
        self._parts: dict[str, dict[int, bytes]] = {}
        self._lock = threading.RLock()
        self._resolve_open = threading.Event()
        self._resolve_open.set()
        self.resolving = 0  # downloads held by stall_resolve()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> HubDouble:
        double = self

        class Handler(_Handler):
            hub = double

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        host, port = self._server.server_address[:2]
        self.url = f"http://{host}:{port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="hub-double", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> HubDouble:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- test controls ---------------------------------------------------------------------
    def seed(self, repo_id: str, files: dict[str, bytes], *, private: bool = False) -> None:
        with self._lock:
            repo = self._repos.setdefault(repo_id, Repo(repo_id, private=private, created_at=_now()))
            tree = {**(repo.commits[-1].tree if repo.commits else {}),
                    **{path: StoredFile(path, content, lfs=False) for path, content in files.items()}}
            self._append_commit(repo, _Caller(None, self.user, True), "seeded by the test", "",
                                tree, added=sorted(files), deleted=[])

    def stall_resolve(self) -> None:
        self._resolve_open.clear()

    def release_resolve(self) -> None:
        self._resolve_open.set()

    # -- inspection helpers for tests ---------------------------------------------------------
    def repo_ids(self) -> list[str]:
        with self._lock:
            return sorted(self._repos)

    def repo(self, repo_id: str) -> dict[str, Any]:
        with self._lock:
            repo = self._repos[repo_id]
            return {"id": repo.repo_id, "private": repo.private, "sha": repo.head.sha,
                    "created_at": repo.created_at}

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        """The content of every file at ``revision`` (LFS files resolved to their real content)."""
        return {path: f.content for path, f in self.file_entries(repo_id, revision).items()}

    def file_entries(self, repo_id: str, revision: str = "main") -> dict[str, StoredFile]:
        with self._lock:
            commit = self._repos[repo_id].resolve(revision)
            if commit is None:
                raise KeyError(revision)
            return dict(commit.tree)

    def commits(self, repo_id: str) -> list[dict[str, Any]]:
        """The repo's commits, oldest first (the first one is the Hub's "initial commit")."""
        with self._lock:
            return [c.summary() for c in self._repos[repo_id].commits]

    def lfs_objects(self, repo_id: str) -> dict[str, bytes]:
        with self._lock:
            return dict(self._repos[repo_id].lfs_objects)

    def requests_to(self, pattern: str) -> list[RecordedRequest]:
        """The recorded requests whose ``METHOD path`` matches the regular expression."""
        return [r for r in list(self.requests) if re.search(pattern, f"{r.method} {r.path}")]

    # -- request handling ---------------------------------------------------------------------
    def _caller(self, request: RecordedRequest) -> _Caller:
        auth = request.header("authorization")
        if auth is None:
            return _Caller(None, None, False)
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or token.strip() not in self._tokens:
            raise HubError(401, INVALID_CREDENTIALS)
        token = token.strip()
        return _Caller(token, self.user, self._tokens[token])

    def _require_writer(self, caller: _Caller, namespace: str, what: str) -> None:
        if caller.token is None:
            raise HubError(401, "You must be authenticated to access this resource.")
        if namespace not in (self.user, *self.orgs):
            raise HubError(403, f"You don't have the rights to {what} under the namespace \"{namespace}\"")
        if not caller.can_write:
            raise HubError(403, f"This token does not have write access to {namespace}. "
                                "Your token needs the \"write\" role.")

    def _get_repo(self, repo_id: str, caller: _Caller) -> Repo:
        repo = self._repos.get(repo_id)
        visible = repo is not None and (not repo.private or (
            caller.user is not None and repo_id.split("/")[0] in (self.user, *self.orgs)))
        if not visible:
            if caller.token is None:
                raise HubError(401, "Repository not found", code="RepoNotFound")
            raise HubError(404, "Repository not found", code="RepoNotFound")
        return repo

    def _resolve(self, repo: Repo, revision: str) -> Commit:
        commit = repo.resolve(unquote(revision))
        if commit is None:
            raise HubError(404, f"Invalid rev id: {unquote(revision)}", code="RevisionNotFound")
        return commit

    def handle(self, request: RecordedRequest) -> tuple[int, dict[str, str], bytes]:
        if self.response_delay:
            time.sleep(self.response_delay)
        if "/resolve/" in request.path and not self._resolve_open.is_set():
            with self._lock:
                self.resolving += 1
            self._resolve_open.wait()
            with self._lock:
                self.resolving -= 1
        split = urlsplit(request.path)
        path, query = unquote(split.path), parse_qs(split.query)
        try:
            for method, pattern, name in _ROUTES:
                match = re.fullmatch(pattern, path)
                if match and method == request.method:
                    with self._lock:
                        if not name.startswith("storage"):
                            caller = self._caller(request)
                        else:
                            caller = _Caller(None, None, False)  # pre-signed: no bearer token
                        return getattr(self, f"_{name}")(request, caller, query, *match.groups())
            self.unhandled.append(request)
            raise HubError(404, f"The test double does not model {request.method} {split.path}")
        except HubError as err:
            headers = {"X-Error-Message": err.message}
            if err.code:
                headers["X-Error-Code"] = err.code
            return _json(err.status, {"error": err.message, **err.extra}, headers)

    # -- endpoints ----------------------------------------------------------------------------
    def _whoami(self, request, caller, query):
        if caller.token is None:
            raise HubError(401, INVALID_CREDENTIALS)
        role = "write" if caller.can_write else "read"
        return _json(200, {
            "type": "user", "id": hashlib.sha1(self.user.encode()).hexdigest()[:24], "name": self.user,
            "fullname": self.user, "email": None, "emailVerified": False, "canPay": False,
            "isPro": False, "periodEnd": None,
            "orgs": [{"type": "org", "name": org, "fullname": org, "roleInOrg": "write"} for org in self.orgs],
            "auth": {"type": "access_token", "accessToken": {"displayName": "specdeck", "role": role,
                                                             "createdAt": _now()}},
        })

    def _resolve_file(self, request, caller, query, repo_id, revision, path):
        repo = self._get_repo(repo_id, caller)
        commit = self._resolve(repo, revision)
        stored = commit.tree.get(path)
        if stored is None:
            raise HubError(404, "Entry not found", code="EntryNotFound")
        return 200, {"Content-Type": "application/octet-stream", "X-Repo-Commit": commit.sha,
                     "ETag": f'"{stored.blob_id}"'}, stored.content

    def _agent_harnesses(self, request, caller, query):
        # The registry huggingface_hub >= 2 uses to tag its user-agent when an AI coding agent
        # runs it. An empty registry: no harness is ever detected.
        return _json(200, {"standardEnvVars": ["AI_AGENT", "AGENT"], "harnesses": {}})

    def _create_repo(self, request, caller, query):
        payload = _load_json(request.body)
        name, organization = payload.get("name"), payload.get("organization")
        if not isinstance(name, str) or not re.fullmatch(r"[\w.-]{1,96}", name):
            raise HubError(400, "Invalid repo name")
        if payload.get("type", "model") != "model":
            raise HubError(400, "The test double only models model repos")
        namespace = organization or (caller.user if caller.user else "")
        self._require_writer(caller, namespace, "create a model")
        repo_id = f"{namespace}/{name}"
        url = f"{self.url}/{repo_id}"
        if repo_id in self._repos:
            raise HubError(409, "You already created this model repo", extra={"url": url})
        if "visibility" in payload:
            private = payload["visibility"] == "private"
        else:
            private = bool(payload.get("private", False))
        repo = Repo(repo_id, private=private, created_at=_now())
        gitattributes = StoredFile(".gitattributes", DEFAULT_GITATTRIBUTES.encode(), lfs=False)
        self._append_commit(repo, caller, "initial commit", "", {".gitattributes": gitattributes},
                            added=[".gitattributes"], deleted=[])
        self._repos[repo_id] = repo
        return _json(200, {"url": url, "name": repo_id, "id": hashlib.sha1(repo_id.encode()).hexdigest()[:24]})

    def _model_info(self, request, caller, query, repo_id, revision=None):
        repo = self._get_repo(repo_id, caller)
        commit = self._resolve(repo, revision or "main")
        blobs = query.get("blobs", ["false"])[0].lower() in ("1", "true")
        siblings = []
        for path in sorted(commit.tree):
            stored = commit.tree[path]
            sibling: dict[str, Any] = {"rfilename": path}
            if blobs:
                sibling.update({"blobId": stored.blob_id, "size": stored.size})
                if stored.lfs:
                    sibling["lfs"] = {"sha256": stored.sha256, "size": stored.size,
                                      "pointerSize": len(stored.pointer or b"")}
            siblings.append(sibling)
        card = _front_matter(commit.tree["README.md"].content) if "README.md" in commit.tree else {}
        body: dict[str, Any] = {
            "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24], "id": repo.repo_id,
            "modelId": repo.repo_id, "author": repo.repo_id.split("/")[0], "sha": commit.sha,
            "lastModified": commit.date, "createdAt": repo.created_at, "private": repo.private,
            "disabled": False, "gated": False, "downloads": 0, "likes": 0,
            "tags": list(card.get("tags") or []) if isinstance(card, dict) else [],
            "siblings": siblings, "spaces": [],
        }
        if isinstance(card, dict) and card:
            body["cardData"] = card
            if isinstance(card.get("library_name"), str):
                body["library_name"] = card["library_name"]
        return _json(200, body)

    def _path_info(self, repo: Repo, commit: Commit, path: str, *, expand: bool) -> dict[str, Any]:
        stored = commit.tree.get(path)
        if stored is not None:
            info: dict[str, Any] = {"type": "file", "oid": stored.blob_id, "size": stored.size, "path": path}
            if stored.lfs:
                info["lfs"] = {"oid": stored.sha256, "size": stored.size,
                               "pointerSize": len(stored.pointer or b"")}
        else:
            children = sorted(p for p in commit.tree if p.startswith(path + "/"))
            listing = "\n".join(f"{p} {commit.tree[p].blob_id}" for p in children).encode()
            info = {"type": "directory", "oid": hashlib.sha1(listing).hexdigest(), "size": 0, "path": path}
        if expand:
            last = self._last_commit_touching(repo, commit, path)
            info["lastCommit"] = {"id": last.sha, "title": last.message, "date": last.date}
            if stored is not None:
                info["securityFileStatus"] = {"status": "safe", "avScan": {"virusFound": False,
                                                                           "virusNames": None},
                                              "pickleImportScan": None}
        return info

    @staticmethod
    def _last_commit_touching(repo: Repo, commit: Commit, path: str) -> Commit:
        history = repo.commits[: repo.commits.index(commit) + 1]
        for older in reversed(history):
            if any(p == path or p.startswith(path + "/") for p in older.added + older.deleted):
                return older
        return history[0]

    def _paths_info(self, request, caller, query, repo_id, revision):
        repo = self._get_repo(repo_id, caller)
        commit = self._resolve(repo, revision)
        form = parse_qs(request.body.decode())
        expand = form.get("expand", ["false"])[0].lower() in ("1", "true")
        out = []
        for path in form.get("paths", []):
            path = path.strip("/")
            exists = path in commit.tree or any(p.startswith(path + "/") for p in commit.tree)
            if exists:
                out.append(self._path_info(repo, commit, path, expand=expand))
        return _json(200, out)

    def _tree(self, request, caller, query, repo_id, revision, path_in_repo=None):
        repo = self._get_repo(repo_id, caller)
        commit = self._resolve(repo, revision)
        base = (path_in_repo or "").strip("/")
        recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
        expand = query.get("expand", ["false"])[0].lower() in ("1", "true")
        prefix = base + "/" if base else ""
        if base and base not in {d for p in commit.tree for d in _parents(p)}:
            raise HubError(404, f"{base} does not exist on \"{revision}\"", code="EntryNotFound")
        entries: set[str] = set()
        for p in commit.tree:
            if not p.startswith(prefix):
                continue
            rest = p[len(prefix):].split("/")
            if recursive:
                entries.update(prefix + "/".join(rest[: i + 1]) for i in range(len(rest)))
            else:
                entries.add(prefix + rest[0])
        return _json(200, [self._path_info(repo, commit, p, expand=expand) for p in sorted(entries)])

    def _validate_yaml(self, request, caller, query):
        payload = _load_json(request.body)
        content = payload.get("content")
        if not isinstance(content, str):
            raise HubError(400, "content is required")
        try:
            metadata = _front_matter(content.encode())
        except yaml.YAMLError as exc:
            return _json(400, {"errors": [{"message": f"Invalid YAML metadata: {exc}"}], "warnings": []})
        errors = []
        if not isinstance(metadata, dict):
            errors.append({"message": "Metadata must be a YAML mapping"})
        else:
            base = metadata.get("base_model")
            for item in base if isinstance(base, list) else ([base] if base is not None else []):
                if not isinstance(item, str) or not re.fullmatch(r"[\w.-]+/[\w.-]+|[\w.-]+", item):
                    errors.append({"message": f"\"base_model\" with value \"{item}\" is not a valid model id"})
            if "library_name" in metadata and not isinstance(metadata["library_name"], str):
                errors.append({"message": "\"library_name\" must be a string"})
            if "tags" in metadata and not (isinstance(metadata["tags"], list)
                                           and all(isinstance(t, str) for t in metadata["tags"])):
                errors.append({"message": "\"tags\" must be an array of strings"})
        if errors:
            return _json(400, {"errors": errors, "warnings": []})
        warnings = [] if metadata else [{"message": "Empty or missing yaml metadata in repo card"}]
        return _json(200, {"errors": [], "warnings": warnings})

    def _lfs_patterns(self, commit: Commit) -> list[str]:
        attributes = commit.tree.get(".gitattributes")
        if attributes is None:
            return []
        patterns = []
        for line in attributes.content.decode(errors="replace").splitlines():
            parts = line.split()
            if len(parts) >= 2 and "filter=lfs" in parts[1:]:
                patterns.append(parts[0])
        return patterns

    def _tracked_by_lfs(self, commit: Commit, path: str) -> bool:
        name = path.rsplit("/", 1)[-1]
        for pattern in self._lfs_patterns(commit):
            if "/" in pattern.rstrip("/"):
                if fnmatch.fnmatch(path, pattern.replace("**/", "*")):
                    return True
            elif fnmatch.fnmatch(name, pattern):
                return True
        return False

    def _preupload(self, request, caller, query, repo_id, revision):
        self._require_writer(caller, repo_id.split("/")[0], "upload files")
        repo = self._get_repo(repo_id, caller)
        commit = self._resolve(repo, revision)
        payload = _load_json(request.body)
        files = payload.get("files")
        if not isinstance(files, list):
            raise HubError(400, "files must be an array")
        out = []
        for item in files:
            path, size = item.get("path"), item.get("size")
            sample = base64.b64decode(item.get("sample") or "")
            if not isinstance(path, str) or not isinstance(size, int):
                raise HubError(400, "each file needs a path and a size")
            lfs = (self._tracked_by_lfs(commit, path) or size > REGULAR_FILE_MAX_BYTES or b"\x00" in sample)
            existing = commit.tree.get(path)
            out.append({"path": path, "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False,
                        "oid": existing.remote_oid if existing is not None else None})
        return _json(200, {"files": out, "commitOid": commit.sha})

    def _lfs_batch(self, request, caller, query, namespace, name):
        repo_id = f"{namespace}/{name}"
        payload = _load_json(request.body)
        if payload.get("operation") != "upload":
            raise HubError(400, "The test double only models LFS uploads")
        self._require_writer(caller, namespace, "upload files")
        repo = self._get_repo(repo_id, caller)
        transfers = payload.get("transfers") or ["basic"]
        objects = []
        for obj in payload.get("objects", []):
            oid, size = obj.get("oid"), obj.get("size")
            if not (isinstance(oid, str) and re.fullmatch(r"[0-9a-f]{64}", oid) and isinstance(size, int)):
                objects.append({"oid": str(oid), "size": int(size or 0),
                                "error": {"code": 422, "message": "Invalid object"}})
                continue
            entry: dict[str, Any] = {"oid": oid, "size": size, "authenticated": True}
            if oid in repo.lfs_objects:
                objects.append(entry)  # already stored: no actions, the client skips the upload
                continue
            signature = secrets.token_hex(16)
            self._signatures[signature] = (repo_id, oid, size)
            storage = f"{self.url}/lfs-storage/{oid}"
            chunk = self.multipart_chunk_size
            if chunk and size > chunk and "multipart" in transfers:
                parts = -(-size // chunk)
                header = {"chunk_size": str(chunk)}
                header.update({str(i): f"{storage}/part/{i}?X-Signature={signature}" for i in range(1, parts + 1)})
                upload = {"href": f"{storage}/complete?X-Signature={signature}", "header": header}
            else:
                upload = {"href": f"{storage}?X-Signature={signature}"}
            entry["actions"] = {
                "upload": {**upload, "expires_at": "2099-01-01T00:00:00.000Z"},
                "verify": {"href": f"{self.url}/{repo_id}.git/info/lfs/objects/verify"},
            }
            objects.append(entry)
        body = json.dumps({"transfer": "basic", "objects": objects, "hash_algo": "sha256"}).encode()
        return 200, {"Content-Type": "application/vnd.git-lfs+json"}, body

    def _signed(self, query, oid: str) -> tuple[str, str, int]:
        signature = (query.get("X-Signature") or [""])[0]
        grant = self._signatures.get(signature)
        if grant is None or grant[1] != oid:
            raise HubError(403, "SignatureDoesNotMatch")
        return grant

    def _store(self, repo_id: str, oid: str, size: int, data: bytes) -> None:
        if len(data) != size or hashlib.sha256(data).hexdigest() != oid:
            raise HubError(400, "BadDigest: the uploaded content does not match the oid and size")
        self._repos[repo_id].lfs_objects[oid] = data

    def _storage_put(self, request, caller, query, oid):
        repo_id, oid, size = self._signed(query, oid)
        self._store(repo_id, oid, size, request.body)
        return 200, {"ETag": f"\"{hashlib.md5(request.body).hexdigest()}\""}, b""

    def _storage_part(self, request, caller, query, oid, number):
        self._signed(query, oid)
        self._parts.setdefault(oid, {})[int(number)] = request.body
        return 200, {"ETag": f"\"{hashlib.md5(request.body).hexdigest()}\""}, b""

    def _storage_complete(self, request, caller, query, oid):
        repo_id, oid, size = self._signed(query, oid)
        payload = _load_json(request.body)
        parts = self._parts.pop(oid, {})
        listed = payload.get("parts") or []
        numbers = [p.get("partNumber") for p in listed]
        if payload.get("oid") != oid or numbers != list(range(1, len(parts) + 1)):
            raise HubError(400, "Invalid multipart completion payload")
        for part in listed:
            expected = f"\"{hashlib.md5(parts[part['partNumber']]).hexdigest()}\""
            if part.get("etag") != expected:
                raise HubError(400, f"Invalid etag for part {part['partNumber']}")
        self._store(repo_id, oid, size, b"".join(parts[n] for n in sorted(parts)))
        return _json(200, {"success": True})

    def _lfs_verify(self, request, caller, query, namespace, name):
        repo_id = f"{namespace}/{name}"
        self._require_writer(caller, namespace, "upload files")
        repo = self._get_repo(repo_id, caller)
        payload = _load_json(request.body)
        data = repo.lfs_objects.get(payload.get("oid", ""))
        if data is None or len(data) != payload.get("size"):
            raise HubError(404, "Object not found or size mismatch")
        return _json(200, {"success": True})

    def _commit(self, request, caller, query, repo_id, revision):
        self._require_writer(caller, repo_id.split("/")[0], "commit")
        repo = self._get_repo(repo_id, caller)
        if unquote(revision) != "main":
            raise HubError(400, "The test double only models commits to the main branch")
        if "x-ndjson" not in (request.header("content-type") or ""):
            raise HubError(400, "Expected an application/x-ndjson body")
        lines = [json.loads(line) for line in request.body.splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "The first line of the commit payload must be the header")
        header = lines[0]["value"]
        summary = header.get("summary")
        if not isinstance(summary, str) or not summary.strip():
            raise HubError(400, "The commit needs a summary")
        parent = header.get("parentCommit")
        if parent is not None and parent != repo.head.sha:
            raise HubError(412, "A commit has happened since. Please refresh and try again.")
        tree = dict(repo.head.tree)
        added, deleted = [], []
        for line in lines[1:]:
            key, value = line.get("key"), line.get("value") or {}
            path = value.get("path")
            if key == "file":
                if value.get("encoding") != "base64":
                    raise HubError(400, "Only base64 file contents are modelled")
                content = base64.b64decode(value.get("content", ""))
                if b"\x00" in content[:8000] or len(content) > REGULAR_FILE_MAX_BYTES:
                    raise HubError(400, f"Your push was rejected because it contains binary or large "
                                        f"files ({path}). Please use LFS.")
                tree[path] = StoredFile(path, content, lfs=False)
                added.append(path)
            elif key == "lfsFile":
                oid = value.get("oid")
                data = repo.lfs_objects.get(oid or "")
                if value.get("algo", "sha256") != "sha256" or data is None:
                    raise HubError(422, f"Your push was rejected because an LFS pointer pointed to a file "
                                        f"that does not exist ({path})")
                if "size" in value and value["size"] != len(data):
                    raise HubError(422, f"LFS pointer size mismatch for {path}")
                tree[path] = StoredFile(path, data, lfs=True)
                added.append(path)
            elif key == "deletedFile":
                if path not in tree:
                    raise HubError(404, "A file with this name doesn't exist", code="EntryNotFound")
                del tree[path]
                deleted.append(path)
            elif key == "deletedFolder":
                prefix = path.rstrip("/") + "/"
                gone = [p for p in tree if p.startswith(prefix)]
                for p in gone:
                    del tree[p]
                deleted.extend(gone)
            else:
                raise HubError(400, f"Unknown commit operation {key!r}")
        commit = self._append_commit(repo, caller, summary, header.get("description") or "", tree,
                                     added=added, deleted=deleted)
        return _json(200, {"success": True, "commitOid": commit.sha,
                           "commitUrl": f"{self.url}/{repo_id}/commit/{commit.sha}", "hookOutput": ""})

    def _append_commit(self, repo: Repo, caller: _Caller, message: str, description: str,
                       tree: dict[str, StoredFile], *, added: list[str], deleted: list[str]) -> Commit:
        parent = repo.commits[-1].sha if repo.commits else None
        date = _now()
        listing = "\n".join(f"{p} {tree[p].blob_id}" for p in sorted(tree))
        raw = f"tree {hashlib.sha1(listing.encode()).hexdigest()}\nparent {parent}\nauthor {caller.user}" \
              f" {date}\n\n{message}\n\n{description}\n{secrets.token_hex(4)}"
        commit = Commit(sha=hashlib.sha1(raw.encode()).hexdigest(), parent=parent, message=message,
                        description=description, date=date, author=caller.user or "", added=added,
                        deleted=deleted, tree=tree)
        repo.commits.append(commit)
        return commit


_REPO = r"([\w.-]+/[\w.-]+)"
_ROUTES: list[tuple[str, str, str]] = [
    ("GET", r"/api/whoami-v2", "whoami"),
    ("GET", r"/api/agent-harnesses", "agent_harnesses"),
    ("POST", r"/api/repos/create", "create_repo"),
    ("POST", r"/api/validate-yaml", "validate_yaml"),
    ("GET", rf"/api/models/{_REPO}/revision/([^/]+)", "model_info"),
    ("POST", rf"/api/models/{_REPO}/paths-info/([^/]+)", "paths_info"),
    ("GET", rf"/api/models/{_REPO}/tree/([^/]+)(?:/(.+))?", "tree"),
    ("POST", rf"/api/models/{_REPO}/preupload/([^/]+)", "preupload"),
    ("POST", rf"/api/models/{_REPO}/commit/([^/]+)", "commit"),
    ("GET", rf"/api/models/{_REPO}", "model_info"),
    ("GET", rf"/{_REPO}/resolve/([^/]+)/(.+)", "resolve_file"),
    ("POST", r"/([\w.-]+)/([\w.-]+)\.git/info/lfs/objects/batch", "lfs_batch"),
    ("POST", r"/([\w.-]+)/([\w.-]+)\.git/info/lfs/objects/verify", "lfs_verify"),
    ("PUT", r"/lfs-storage/([0-9a-f]{64})", "storage_put"),
    ("PUT", r"/lfs-storage/([0-9a-f]{64})/part/(\d+)", "storage_part"),
    ("POST", r"/lfs-storage/([0-9a-f]{64})/complete", "storage_complete"),
]


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    return status, {"Content-Type": "application/json; charset=utf-8", **(headers or {})}, json.dumps(body).encode()


def _load_json(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body or b"{}")
    except json.JSONDecodeError as exc:
        raise HubError(400, f"Invalid JSON body: {exc}") from exc
    if not isinstance(value, dict):
        raise HubError(400, "Expected a JSON object")
    return value


def _front_matter(content: bytes) -> Any:
    text = content.decode("utf-8", "replace")
    match = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", text, flags=re.S)
    return (yaml.safe_load(match.group(1)) or {}) if match else {}


def _parents(path: str) -> list[str]:
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: HubDouble

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - keep stderr quiet
        pass

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _serve(self) -> None:
        request = RecordedRequest(self.command, self.path, list(self.headers.items()), self._read_body())
        self.hub.requests.append(request)
        try:
            status, headers, body = self.hub.handle(request)
        except Exception as exc:  # a bug in the double: answer 500 rather than hang the client
            status, headers, body = _json(500, {"error": f"test double failure: {exc!r}"})
        request.status, request.response_headers, request.response_body = status, dict(headers), body
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _serve
