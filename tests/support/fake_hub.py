"""Fake model hosts on loopback, built on tests/support/http_server.py: no mocks of HTTP.

- `FakeHuggingFace`: the Hub's model API as huggingface_hub calls it (`GET /api/models/ORG/REPO`
  and `/api/models/ORG/REPO/revision/REV`: `id`, `sha`, `siblings[].rfilename`, `gated`), with the
  Hub's error answers (404 + `X-Error-Code: RepoNotFound` / `RevisionNotFound`), and the file host
  `GET /ORG/REPO/resolve/REV/PATH` (Range via the server, 304 to a matching If-None-Match; a gated
  repo answers 401 + `GatedRepo` without the token).
- `FakeModelScope`: `GET /api/v1/models/ORG/REPO/repo/files?Revision=R&Recursive=true` answering
  `{"Code": 200, "Data": {"Files": [{"Name", "Path", "Type": "blob"|"tree", "Size", "Revision"}]},
  "Success": true}` (directories listed as Type "tree", as ModelScope does), and
  `GET /models/ORG/REPO/resolve/REV/PATH`.
- `FakeOllamaRegistry`: `GET /v2/NS/MODEL/manifests/TAG` (a Docker v2 manifest),
  `GET /v2/NS/MODEL/blobs/sha256:HEX` (its digest as its ETag, 304 to a matching If-None-Match) and
  `GET /v2/NS/MODEL/tags/list` (`{"name", "tags"}`); unknown
  names answer 404 + `MANIFEST_UNKNOWN` (`NAME_UNKNOWN` for a tag list).

Layout helpers write the on-disk stores the resolvers read: `write_hub_cache` (the Hugging Face hub
cache / LLAMA_CACHE layout, snapshot symlinks to blobs) and `write_ollama_store` (Ollama's
manifests/ and blobs/).
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, unquote

import pytest

from planner.registry import references
from planner.system import net
from tests.support.http_server import LoopbackServer, Reply, Request, ServerPool

MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"
PROJECTOR_MEDIA_TYPE = "application/vnd.ollama.image.projector"
MANIFEST_MEDIA_TYPE = "application/vnd.docker.distribution.manifest.v2+json"


def settle(server: LoopbackServer, quiet_s: float = 0.1, limit_s: float = 3.0) -> LoopbackServer:
    """The server once its log has stopped growing: it records a request after answering it, so a
    client can be done before the record exists. Count requests on what this returns."""
    deadline = time.monotonic() + limit_s
    count = server.requests()
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = server.requests()
        if now == count:
            break
        count = now
    return server


def _json(status: int, doc: object, headers: dict[str, str] | None = None) -> Reply:
    return Reply(status, json.dumps(doc).encode(), {"Content-Type": "application/json", **(headers or {})})


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class FakeRepo:
    files: dict[str, Path]                 # path in the repository -> the file served
    commit: str = "c" * 40
    branches: dict[str, str] = field(default_factory=dict)   # other revisions -> commits
    gated: bool = False


class FakeHuggingFace:
    """With `storage`, file requests are answered as the Hub answers them: 302 to a storage host
    (a second server) that serves the bytes without asking for the token."""

    def __init__(self, server: LoopbackServer, token: str | None = None,
                 storage: LoopbackServer | None = None) -> None:
        self.server = server
        self.token = token
        self.storage = storage
        self.repos: dict[str, FakeRepo] = {}
        server.mount("api/models", self._api, prefix=True, protected=False)
        server.mount("/", self._resolve, prefix=True, protected=False)

    @property
    def endpoint(self) -> str:
        return self.server.base_url

    def add(self, repo: str, files: dict[str, Path], **kw: object) -> FakeRepo:
        self.repos[repo] = FakeRepo(dict(files), **kw)  # type: ignore[arg-type]
        return self.repos[repo]

    def _commit(self, repo: FakeRepo, revision: str) -> str | None:
        if revision in ("main", repo.commit):
            return repo.commit
        return repo.branches.get(revision)

    def _api(self, req: Request) -> Reply:
        rest = req.path.removeprefix("/api/models/").split("/")
        repo_id, revision = "/".join(rest[:2]), "main"
        if len(rest) >= 4 and rest[2] == "revision":
            revision = unquote("/".join(rest[3:]))
        repo = self.repos.get(repo_id)
        if repo is None:
            return _json(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
        commit = self._commit(repo, revision)
        if commit is None:
            return _json(404, {"error": f"Invalid rev id: {revision}"}, {"X-Error-Code": "RevisionNotFound"})
        return _json(200, {"id": repo_id, "modelId": repo_id, "sha": commit, "private": False,
                           "gated": "manual" if repo.gated else False, "tags": [], "downloads": 0, "likes": 0,
                           "siblings": [{"rfilename": p} for p in repo.files]})

    def _resolve(self, req: Request) -> Reply:
        parts = req.path.lstrip("/").split("/")
        if len(parts) < 5 or parts[2] != "resolve":
            return _json(404, {"error": "not found"})
        repo_id, revision, path = "/".join(parts[:2]), unquote(parts[3]), unquote("/".join(parts[4:]))
        repo = self.repos.get(repo_id)
        if repo is None or self._commit(repo, revision) is None:
            return _json(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
        if repo.gated and req.headers.get("authorization") != f"Bearer {self.token}":
            return _json(401, {"error": "Access to this model is restricted"}, {"X-Error-Code": "GatedRepo"})
        if path not in repo.files:
            return _json(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
        headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{repo.commit}-{path}"'}
        if req.headers.get("if-none-match") == headers["ETag"]:   # a revalidation: not modified
            return Reply(304, b"", headers)
        if self.storage is not None:
            blob = f"/blobs/{repo_id}/{repo.commit}/{path}"
            self.storage.mount(blob, repo.files[path], protected=False)
            return Reply(302, b"", {**headers, "Location": self.storage.url(blob)})
        return Reply(200, repo.files[path], headers)


class FakeModelScope:
    def __init__(self, server: LoopbackServer) -> None:
        self.server = server
        self.repos: dict[str, FakeRepo] = {}
        server.mount("api/v1/models", self._files, prefix=True, protected=False)
        server.mount("models", self._resolve, prefix=True, protected=False)

    @property
    def endpoint(self) -> str:
        return self.server.base_url

    def add(self, repo: str, files: dict[str, Path]) -> FakeRepo:
        self.repos[repo] = FakeRepo(dict(files), commit="master")
        return self.repos[repo]

    def _files(self, req: Request) -> Reply:
        rest = req.path.removeprefix("/api/v1/models/").split("/")
        repo = self.repos.get("/".join(rest[:2]))
        query = parse_qs(req.query)
        revision = query.get("Revision", ["master"])[0]
        if repo is None or rest[2:] != ["repo", "files"] or revision != repo.commit:
            return _json(404, {"Code": 10010205001, "Message": "model not found", "Success": False})
        listed: list[dict[str, object]] = []
        dirs = sorted({p.rsplit("/", 1)[0] for p in repo.files if "/" in p})
        for d in dirs:
            listed.append({"Name": d.rsplit("/", 1)[-1], "Path": d, "Type": "tree", "Size": 0, "Revision": revision})
        for p, f in repo.files.items():
            listed.append({"Name": p.rsplit("/", 1)[-1], "Path": p, "Type": "blob", "Size": f.stat().st_size,
                           "Revision": revision, "Sha256": ""})
        return _json(200, {"Code": 200, "Data": {"Files": listed}, "Message": "success", "Success": True})

    def _resolve(self, req: Request) -> Reply:
        parts = req.path.removeprefix("/models/").split("/")
        repo = self.repos.get("/".join(parts[:2]))
        if repo is None or len(parts) < 5 or parts[2] != "resolve":
            return _json(404, {"Code": 10010205001, "Message": "not found", "Success": False})
        path = unquote("/".join(parts[4:]))
        if path not in repo.files:
            return _json(404, {"Code": 10010205001, "Message": "file not found", "Success": False})
        return Reply(200, repo.files[path])


@dataclass
class OllamaLayer:
    media_type: str
    file: Path
    digest: str = ""

    def __post_init__(self) -> None:
        self.digest = self.digest or "sha256:" + sha256_file(self.file)


def manifest(layers: list[OllamaLayer]) -> dict[str, object]:
    """A Docker v2 manifest as Ollama writes it for a pulled model."""
    return {"schemaVersion": 2, "mediaType": MANIFEST_MEDIA_TYPE,
            "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                       "digest": "sha256:" + "0" * 64, "size": 2},
            "layers": [{"mediaType": layer.media_type, "digest": layer.digest, "size": layer.file.stat().st_size}
                       for layer in layers]}


class FakeOllamaRegistry:
    def __init__(self, server: LoopbackServer) -> None:
        self.server = server
        self.models: dict[tuple[str, str, str], list[OllamaLayer]] = {}
        server.mount("v2", self._v2, prefix=True, protected=False)

    @property
    def endpoint(self) -> str:
        return self.server.base_url

    def add(self, name: str, tag: str, layers: list[OllamaLayer], namespace: str = "library") -> None:
        self.models[(namespace, name, tag)] = layers

    def _v2(self, req: Request) -> Reply:
        parts = req.path.removeprefix("/v2/").split("/")
        if len(parts) == 4 and parts[2:] == ["tags", "list"]:
            tags = [t for (ns, n, t) in self.models if (ns, n) == (parts[0], parts[1])]
            if not tags:
                return _json(404, {"errors": [{"code": "NAME_UNKNOWN", "message": "repository name not known"}]})
            return _json(200, {"name": f"{parts[0]}/{parts[1]}", "tags": tags})
        if len(parts) != 4 or parts[2] not in ("manifests", "blobs"):
            return _json(404, {"errors": [{"code": "NAME_UNKNOWN"}]})
        namespace, name, kind, ref = parts
        if kind == "manifests":
            layers = self.models.get((namespace, name, ref))
            if layers is None:
                return _json(404, {"errors": [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown"}]})
            return _json(200, manifest(layers), {"Content-Type": MANIFEST_MEDIA_TYPE})
        for (ns, n, _), layers in self.models.items():
            for layer in layers:
                if (ns, n) == (namespace, name) and layer.digest == unquote(ref):
                    etag = f'"{layer.digest}"'      # a blob is named by its digest: it never changes
                    if req.headers.get("if-none-match") == etag:
                        return Reply(304, b"", {"ETag": etag})
                    return Reply(200, layer.file, {"ETag": etag})
        return _json(404, {"errors": [{"code": "BLOB_UNKNOWN"}]})


def write_ollama_store(root: Path, name: str, tag: str, layers: list[OllamaLayer],
                       namespace: str = "library", host: str = "registry.ollama.ai") -> Path:
    """Lay a pulled model out as Ollama does: each layer's file moved to blobs/sha256-HEX, the
    manifest at manifests/HOST/NAMESPACE/NAME/TAG. Returns the manifest's path."""
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    for layer in layers:
        blob = root / "blobs" / layer.digest.replace(":", "-")
        if not blob.exists():
            os.replace(layer.file, blob)
        layer.file = blob
    path = root / "manifests" / host / namespace / name / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest(layers)))
    return path


def write_hub_cache(root: Path, repo: str, files: dict[str, Path], commit: str = "a" * 40,
                    branch: str = "main") -> Path:
    """Lay files out as the hub cache (and the pinned llama.cpp in LLAMA_CACHE) keeps them:
    blobs/OID, snapshots/COMMIT/PATH as a relative symlink to the blob, refs/BRANCH holding COMMIT.
    The files are moved into blobs/. Returns the snapshot directory."""
    repo_dir = root / ("models--" + repo.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / commit
    (repo_dir / "blobs").mkdir(parents=True, exist_ok=True)
    for path, file in files.items():
        blob = repo_dir / "blobs" / sha256_file(file)
        os.replace(file, blob)
        link = snapshot / path
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / branch).write_text(commit)
    return snapshot


def dead_endpoint() -> str:
    """An http URL on a loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


@dataclass
class Hosts:
    """A fake Hugging Face, ModelScope and Ollama registry on loopback, the settings naming them,
    and a directory for the files they serve."""

    hf: FakeHuggingFace
    ms: FakeModelScope
    ollama: FakeOllamaRegistry
    settings: net.NetSettings
    files: Path


@contextmanager
def hosted(servers: ServerPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Hosts]:
    """The three fakes started, the environment and the current settings pointing at them (no
    retries), resolutions forgotten afterwards. Use with the net_sandbox fixture."""
    hf, ms, ol = FakeHuggingFace(servers.start()), FakeModelScope(servers.start()), FakeOllamaRegistry(servers.start())
    for var, url in (("HF_ENDPOINT", hf.endpoint), ("MODELSCOPE_ENDPOINT", ms.endpoint),
                     ("FITPLAN_OLLAMA_REGISTRY", ol.endpoint), ("FITPLAN_HTTP_RETRIES", "0")):
        monkeypatch.setenv(var, url)
    files = tmp_path / "files"
    files.mkdir()
    try:
        with net.use(net.from_environment()) as settings:
            yield Hosts(hf, ms, ol, settings, files)
    finally:
        references.forget()
