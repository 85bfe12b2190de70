"""Model repositories: a Hugging Face or ModelScope repository's file list, from a local cache or the network.

A repository reference (`ORG/REPO`, a quant tag or a file, a revision) becomes the locations the
reader opens: snapshot paths when a local cache holds every file the selection needs, else
`.../resolve/COMMIT/FILE` URLs the reader reads by Range. File selection is llama.cpp's
(`hub_rules`); this module only lists files.

Local caches, in order: `LLAMA_CACHE` then the Hugging Face hub cache (`HF_HUB_CACHE`). Both have
the hub's layout, `models--ORG--REPO/{refs/BRANCH, snapshots/COMMIT/PATH, blobs/}`: the pinned
llama.cpp writes its `-hf` downloads there (common/hf-cache.cpp:33-62 takes LLAMA_CACHE as the hub
cache root when set, else HF_HUB_CACHE/HF_HOME's), as huggingface_hub does. A cache answers
without any request, like llama.cpp's offline resolution (download.cpp:964-982).

The network: the Hub's model API through huggingface_hub (`model_info` at a revision: the commit
and every file path in one request, where llama.cpp makes two, hf-cache.cpp:206-351 refs then
tree); ModelScope's `/api/v1/models/ORG/REPO/repo/files` listing through planner.system.http.
The rules take the first matching file in listing order: here the API's `siblings` order, where
llama.cpp walks the tree listing; they can differ only when several files match one quant tag.
A 429 from the Hub's API is retried as its Retry-After asks, within planner.system.http's bound
(huggingface_hub's `model_info` does not retry). `list_repository` is the whole listing, for
`fitplan choose` (planner.registry.candidates).
"""
from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote

from planner.core.errors import BadInput, RemoteError
from planner.registry import hub_rules
from planner.system import net

log = logging.getLogger(__name__)

# ModelScope's default branch (modelscope's DEFAULT_MODEL_REVISION); the Hub's is resolved by its API.
MS_DEFAULT_REVISION = "master"
HF_DEFAULT_BRANCH = "main"          # hf-cache.cpp:243 and 373: `main` first among refs

T = TypeVar("T")

_COMMIT = re.compile(r"^[0-9a-fA-F]{40}$")     # hf-cache.cpp:156-158 is_valid_commit


@dataclass(frozen=True)
class RepoRef:
    """`ORG/REPO` plus what to take from it: a file path, or a quant tag ('' = llama.cpp's default)."""

    hub: str                     # "hf" or "ms"
    repo: str
    tag: str = ""
    file: str = ""
    revision: str | None = None

    def __str__(self) -> str:
        text = f"{self.hub}://{self.repo}" + (f"/{self.file}" if self.file else "")
        return text + (f":{self.tag}" if self.tag else "") + (f"@{self.revision}" if self.revision else "")


@dataclass(frozen=True)
class Located:
    """The selection's files as locations (paths or URLs), and where they came from."""

    shards: tuple[str, ...]
    mmproj: str | None
    origin: str                  # "cache" or "network"


def _select(ref: RepoRef, files: Sequence[str]) -> hub_rules.Selection | None:
    if ref.file:
        if ref.file not in files:       # download.cpp:730-741: an exact path, nothing else
            return None
        primary: str | None = ref.file
    else:
        primary = hub_rules.best_model(files, ref.tag)
    if primary is None:
        return None
    return hub_rules.Selection(primary, hub_rules.split_files(files, primary),
                               hub_rules.best_sibling(files, primary, hub_rules.MMPROJ_KEYWORD))


def _refuse(ref: RepoRef, files: Sequence[str], where: str) -> BadInput:
    """The one-line error for a listing that holds no file to load (download.cpp:737-749 lists the
    GGUF files; here the quants, then the files, so the line stays short)."""
    if hub_rules.PRESET_FILE in files:
        return BadInput(f"{ref}: {ref.repo} is a llama.cpp preset repository ({hub_rules.PRESET_FILE}), "
                        f"not a model: name the model's own repository or file")
    ggufs = hub_rules.gguf_files(files)
    if not ggufs:
        return BadInput(f"{ref}: {where} holds no GGUF file")
    quants = hub_rules.available_quants(files)
    if ref.file:
        return BadInput(f"{ref}: no file {ref.file!r} in {where}; its GGUF files: {', '.join(ggufs[:12])}"
                        + (" ..." if len(ggufs) > 12 else ""))
    what = f"quant tag {ref.tag!r}" if ref.tag else "model file"
    return BadInput(f"{ref}: no {what} in {where}; quants available: {', '.join(quants) or 'none'}")


def _complete(ref: RepoRef, sel: hub_rules.Selection, where: str) -> None:
    info = hub_rules.split_info(sel.primary)
    if info is not None and info.count > 1 and len(sel.shards) != info.count:
        raise BadInput(f"{ref}: {sel.primary} is shard 1 of {info.count} but {where} holds "
                       f"{len(sel.shards)} of them")


# --- local caches ------------------------------------------------------------------------------------

def cache_roots() -> list[Path]:
    s = net.current()
    roots: list[Path] = []
    for root in (s.llama_cache, s.hf_hub_cache):
        if root not in roots:
            roots.append(root)
    return roots


def _cached_commit(repo_dir: Path, revision: str | None) -> str | None:
    """The snapshot a revision names in a hub cache: refs/REV's commit, a commit itself, or with no
    revision refs/main, else the first valid ref (hf-cache.cpp:353-381 get_cached_ref)."""
    refs = repo_dir / "refs"
    if revision is not None:
        if _COMMIT.match(revision) and (repo_dir / "snapshots" / revision).is_dir():
            return revision
        candidates = [refs / revision]
    else:
        candidates = ([refs / HF_DEFAULT_BRANCH] + sorted(refs.glob("*"))) if refs.is_dir() else []
    for ref_file in candidates:
        try:
            commit = ref_file.read_text(encoding="utf-8").strip().splitlines()[0]
        except (OSError, IndexError):
            continue
        if _COMMIT.match(commit):
            return commit
    return None


def cached_files(root: Path, repo: str, revision: str | None) -> tuple[Path, list[str]] | None:
    """A cached snapshot's directory and the files in it that resolve (a dangling link to a blob
    still downloading is not a file), sorted: the order llama.cpp's directory walk leaves unspecified."""
    repo_dir = root / ("models--" + repo.replace("/", "--"))     # hf-cache.cpp:78-83
    commit = _cached_commit(repo_dir, revision) if repo_dir.is_dir() else None
    if commit is None:
        return None
    snapshot = repo_dir / "snapshots" / commit
    if not snapshot.is_dir():
        return None
    files = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())
    return snapshot, files


def from_cache(ref: RepoRef) -> Located | None:
    """The selection from the first local cache holding every file of it; None when none does."""
    if ref.hub != "hf":
        return None
    for root in cache_roots():
        found = cached_files(root, ref.repo, ref.revision)
        if found is None:
            continue
        snapshot, files = found
        sel = _select(ref, files)
        if sel is None:
            continue
        info = hub_rules.split_info(sel.primary)
        if info is not None and info.count > 1 and len(sel.shards) != info.count:
            continue                    # a split not fully downloaded: the network has the rest
        log.debug("%s: from the cache %s", ref, snapshot)
        return Located(tuple(str(snapshot / f) for f in sel.shards),
                       str(snapshot / sel.mmproj) if sel.mmproj else None, "cache")
    return None


# --- the network -------------------------------------------------------------------------------------

def _hf_listing(ref: RepoRef) -> tuple[str, list[str]]:
    """The commit a revision names and every file path in it, from the Hub's model API."""
    # huggingface_hub and the HTTP stack cost over half a second to import: only when asked. Its
    # telemetry off unless the user says otherwise: with it on, building the user agent fetches the
    # endpoint's /api/agent-harnesses list (utils/_detect_agent.py), one more round trip per day.
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    import httpx2
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    from planner.system import http

    s = net.current()
    api = HfApi(endpoint=s.hf_endpoint, token=s.token or False, library_name="fitplan")
    try:
        info = _rate_limited(lambda: api.model_info(ref.repo, revision=ref.revision, timeout=s.timeout_s), ref)
    except RevisionNotFoundError:
        raise BadInput(f"{ref}: {ref.repo} has no revision {ref.revision!r} on {s.hf_endpoint}") from None
    except GatedRepoError:
        raise BadInput(f"{ref}: {ref.repo} is a gated repository: accept its terms on the Hub, "
                       f"then {http.TOKEN_HINT}") from None
    except RepositoryNotFoundError:
        raise BadInput(f"{ref}: no repository {ref.repo} on {s.hf_endpoint}; if it exists, "
                       f"{http.TOKEN_HINT}") from None
    except OfflineModeIsEnabled:
        raise BadInput(f"{ref}: not in the local caches ({', '.join(map(str, cache_roots()))}) "
                       f"and HF_HUB_OFFLINE forbids asking {s.hf_endpoint}") from None
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else "?"
        raise BadInput(f"{ref}: {s.hf_endpoint} answered HTTP {status} for {ref.repo}") from None
    except httpx2.TransportError as e:
        raise BadInput(f"{ref}: cannot reach the Hugging Face endpoint {s.hf_endpoint} "
                       f"({type(e).__name__}: {e}); set HF_ENDPOINT, or plan from a local file") from None
    if info.gated and not s.token:
        # the API lists a gated repo's files to anyone; its files answer 401 without a token
        raise BadInput(f"{ref}: {ref.repo} is a gated repository: accept its terms on the Hub, "
                       f"then {http.TOKEN_HINT}")
    commit = info.sha or ref.revision or HF_DEFAULT_BRANCH
    return commit, [sib.rfilename for sib in info.siblings or ()]


def _rate_limited(call: Callable[[], T], ref: RepoRef) -> T:
    """`call` (a Hub API request through huggingface_hub, which does not retry one) again after a 429,
    waiting what its Retry-After asks (planner.system.http's rule: up to MAX_RETRY_AFTER_S, a longer wait
    refused at once), at most the settings' retries."""
    from huggingface_hub.errors import HfHubHTTPError

    from planner.system import http

    s = net.current()
    retries = max(0, s.retries)
    for attempt in range(retries + 1):
        try:
            return call()
        except HfHubHTTPError as e:
            if e.response is None or e.response.status_code != 429:
                raise
            after = http.retry_after_s(e.response.headers.get("Retry-After"))
            too_long = http.rate_limit_problem(429, after)
            if too_long:
                raise BadInput(f"{ref}: {s.hf_endpoint} answered {too_long}") from None
            if attempt == retries:
                raise BadInput(f"{ref}: {s.hf_endpoint} answered HTTP 429 (rate limited) {retries + 1} time(s) "
                               f"in a row: try again later, or raise FITPLAN_HTTP_RETRIES") from None
            time.sleep(max(after or 0.0, http.BACKOFF_BASE_S * 2 ** attempt))
    raise AssertionError("unreachable")  # pragma: no cover


def _ms_listing(ref: RepoRef) -> tuple[str, list[str]]:
    """A ModelScope revision's file paths (`Data.Files[].Path`, directories have Type 'tree')."""
    from planner.system import http

    s = net.current()
    revision = ref.revision or MS_DEFAULT_REVISION
    url = (f"{s.ms_endpoint}/api/v1/models/{ref.repo}/repo/files"
           f"?Revision={quote(revision, safe='')}&Recursive=true")
    try:
        doc = http.get_json(url)
    except RemoteError as e:
        if e.status == 404:
            raise BadInput(f"{ref}: no repository {ref.repo} (or no revision {revision!r}) "
                           f"on {s.ms_endpoint}") from None
        if e.status is None:
            raise BadInput(f"{ref}: cannot reach the ModelScope endpoint {s.ms_endpoint} ({e.problem}); "
                           f"set MODELSCOPE_ENDPOINT, or plan from a local file") from None
        raise
    data = doc.get("Data") if isinstance(doc, dict) else None
    if not isinstance(data, dict) or doc.get("Success") is False or doc.get("Code", 200) != 200:
        message = doc.get("Message") if isinstance(doc, dict) else None
        raise BadInput(f"{ref}: {s.ms_endpoint} refused the file listing"
                       + (f": {' '.join(str(message).split())}" if message else ""))
    files = [f["Path"] for f in data.get("Files") or () if isinstance(f, dict) and f.get("Type") != "tree"
             and isinstance(f.get("Path"), str)]
    return revision, files


def _url(ref: RepoRef, commit: str, path: str) -> str:
    s = net.current()
    if ref.hub == "hf":
        from huggingface_hub import hf_hub_url

        return hf_hub_url(ref.repo, path, revision=commit, endpoint=s.hf_endpoint)
    return f"{s.ms_endpoint}/models/{ref.repo}/resolve/{quote(commit, safe='')}/{quote(path)}"


def from_network(ref: RepoRef) -> Located:
    commit, files = _hf_listing(ref) if ref.hub == "hf" else _ms_listing(ref)
    where = f"{ref.repo}@{commit[:12]}" if ref.hub == "hf" else f"{ref.repo}@{commit}"
    if hub_rules.PRESET_FILE in files:
        raise _refuse(ref, files, where)
    sel = _select(ref, files)
    if sel is None:
        raise _refuse(ref, files, where)
    _complete(ref, sel, where)
    return Located(tuple(_url(ref, commit, f) for f in sel.shards),
                   _url(ref, commit, sel.mmproj) if sel.mmproj else None, "network")


@dataclass(frozen=True)
class Listing:
    """Every file path of one revision of a repository, as its endpoint lists them."""

    ref: RepoRef
    commit: str
    files: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{self.ref.repo}@{self.commit[:12]}" if self.ref.hub == "hf" else f"{self.ref.repo}@{self.commit}"

    def location(self, path: str) -> str:
        """The URL the reader reads `path` from (by Range)."""
        return _url(self.ref, self.commit, path)


def list_repository(ref: RepoRef) -> Listing:
    """The repository's files from its endpoint's API (the Hub's model API or ModelScope's file
    listing), never from a local cache: a cache holds what was downloaded, not what there is."""
    commit, files = _hf_listing(ref) if ref.hub == "hf" else _ms_listing(ref)
    return Listing(ref, commit, tuple(files))


def locate(ref: RepoRef) -> Located:
    """Local caches first, then the repository's endpoint."""
    return from_cache(ref) or from_network(ref)
