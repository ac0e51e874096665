"""A real Hugging Face Hub API server for the tests: an http.server on a free loopback
port, in a thread of this process, serving the part of the Hub that huggingface_hub's
calls in this project make (tests/ is on sys.path through its conftest.py):

    GET  /api/models/{repo}/commits/{revision}     HfApi.list_repo_commits (paginated,
                                                   a Link header as the Hub sends)
    GET  /api/models/{repo}[/revision/{revision}]  HfApi.model_info / repo_info
    GET  /api/models/{repo}/tree/{revision}        HfApi.list_repo_tree (snapshot_download;
                                                   files only, one page)
    HEAD/GET /{repo}/resolve/{revision}/{filename} hf_hub_download (X-Repo-Commit, ETag,
                                                   Content-Length)

A repository is a set of commits, each with its parent and its whole tree of files, and
refs naming a head commit each: `main`, and `refs/pr/N` for a pull request, whose commits
are not on main. Unknown repositories, revisions and files are answered 404 with the
X-Error-Code the Hub sends, so huggingface_hub raises its usual errors.

    with hub_emulator() as hub:
        main = hub.commit("org/model", {"config.json": b"{}"})
        pr = hub.commit("org/model", {"model.bin": b"x"}, ref="refs/pr/1")
        HfApi(endpoint=hub.endpoint).list_repo_commits("org/model")   # main's history
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

from loopback import free_port


@dataclass(frozen=True)
class HubCommit:
    id: str
    parent: str | None
    title: str
    files: dict[str, bytes]  # the whole tree at this commit
    date: str


@dataclass
class HubRepo:
    commits: dict[str, HubCommit] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)  # "main", "refs/pr/1" -> head id

    def resolve(self, revision: str) -> HubCommit | None:
        """The commit a ref name or a full commit id names (None: neither)."""
        head = self.refs.get(revision, revision)
        return self.commits.get(head)

    def history(self, head: HubCommit) -> list[HubCommit]:
        """`head` and its ancestors, newest first (what the Hub lists for a revision)."""
        found = [head]
        while found[-1].parent is not None:
            found.append(self.commits[found[-1].parent])
        return found


class HubEmulator:
    """The repositories served, and the server once started (`endpoint`)."""

    def __init__(self, *, page_size: int = 2) -> None:
        # A small page makes every listing of more than two commits go through the
        # pagination that huggingface_hub follows on the real Hub.
        self.page_size = page_size
        self.repos: dict[str, HubRepo] = {}
        self.requests: list[str] = []  # "METHOD path", in order: what the tests were asked
        self.lock = threading.Lock()
        self.port = 0
        self.server: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def commit(self, repo_id: str, files: dict[str, bytes], *, ref: str = "main",
               title: str = "upload") -> str:
        """Commit `files` (added to the tree of `ref`'s head) on `ref`; its id. A new
        `refs/pr/N` starts from main's head, as a pull request on the Hub does."""
        with self.lock:
            repo = self.repos.setdefault(repo_id, HubRepo())
            parent_id = repo.refs.get(ref, repo.refs.get("main"))
            parent = repo.commits.get(parent_id) if parent_id is not None else None
            tree = {**(parent.files if parent else {}), **files}
            digest = hashlib.sha1(repr((parent_id, title, sorted(tree.items()))).encode())
            commit_id = digest.hexdigest()
            repo.commits[commit_id] = HubCommit(
                commit_id, parent_id, title, tree,
                datetime.now(UTC).isoformat().replace("+00:00", "Z"))
            repo.refs[ref] = commit_id
            return commit_id

    def start(self) -> None:
        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True,
                                       name="hub-emulator")
        self.thread.start()

    def stop(self) -> None:
        """Stop serving: the port refuses connections afterwards (an unreachable Hub)."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        if self.thread is not None:
            self.thread.join(timeout=5)
            self.thread = None


@contextlib.contextmanager
def hub_emulator(*, page_size: int = 2) -> Iterator[HubEmulator]:
    hub = HubEmulator(page_size=page_size)
    hub.start()
    try:
        yield hub
    finally:
        hub.stop()


def _handler(hub: HubEmulator) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base's name)
            pass  # the tests read `hub.requests`, not stderr

        def do_GET(self) -> None:
            self.route(body=True)

        def do_HEAD(self) -> None:
            self.route(body=False)

        def route(self, *, body: bool) -> None:
            url = urlsplit(self.path)
            hub.requests.append(f"{self.command} {url.path}")
            # Revisions come quoted with safe="" (refs%2Fpr%2F1): split, then unquote.
            parts = [unquote(part) for part in url.path.strip("/").split("/")]
            query = parse_qs(url.query)
            with hub.lock:
                if parts[:2] == ["api", "models"] and len(parts) >= 4:
                    repo_id, rest = "/".join(parts[2:4]), parts[4:]
                    if rest[:1] == ["commits"] and len(rest) >= 2:
                        self.commits(repo_id, "/".join(rest[1:]), query, body)
                        return
                    if rest[:1] == ["tree"] and len(rest) >= 2:
                        self.tree(repo_id, rest[1], "/".join(rest[2:]), body)
                        return
                    if not rest or (rest[0] == "revision" and len(rest) >= 2):
                        self.info(repo_id, "/".join(rest[1:]) or "main", body)
                        return
                if len(parts) >= 5 and parts[2] == "resolve":
                    self.resolve("/".join(parts[:2]), parts[3], "/".join(parts[4:]), body)
                    return
            self.reply(404, {"error": f"no route for {url.path}"}, body)

        def found(self, repo_id: str, revision: str,
                  body: bool) -> tuple[HubRepo, HubCommit] | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self.reply(404, {"error": "Repository not found"}, body,
                           {"X-Error-Code": "RepoNotFound"})
                return None
            commit = repo.resolve(revision)
            if commit is None:
                self.reply(404, {"error": f"Invalid rev id: {revision}"}, body,
                           {"X-Error-Code": "RevisionNotFound"})
                return None
            return repo, commit

        def commits(self, repo_id: str, revision: str, query: dict[str, list[str]],
                    body: bool) -> None:
            found = self.found(repo_id, revision, body)
            if found is None:
                return
            repo, head = found
            history = repo.history(head)
            page = int(query.get("p", ["0"])[0])
            start = page * hub.page_size
            items = [{"id": c.id, "title": c.title, "message": "", "date": c.date,
                      "authors": [{"user": "emulator"}]}
                     for c in history[start:start + hub.page_size]]
            headers = {}
            if start + hub.page_size < len(history):
                path = urlsplit(self.path).path
                headers["Link"] = f'<{hub.endpoint}{path}?p={page + 1}>; rel="next"'
            self.reply(200, items, body, headers)

        def info(self, repo_id: str, revision: str, body: bool) -> None:
            found = self.found(repo_id, revision, body)
            if found is None:
                return
            _, commit = found
            self.reply(200, {"id": repo_id, "modelId": repo_id, "sha": commit.id,
                             "private": False, "lastModified": commit.date,
                             "siblings": [{"rfilename": name} for name in sorted(commit.files)]},
                       body)

        def tree(self, repo_id: str, revision: str, folder: str, body: bool) -> None:
            found = self.found(repo_id, revision, body)
            if found is None:
                return
            _, commit = found
            prefix = f"{folder}/" if folder else ""
            self.reply(200, [{"type": "file", "path": name, "size": len(content),
                              "oid": hashlib.sha1(content).hexdigest()}
                             for name, content in sorted(commit.files.items())
                             if name.startswith(prefix)], body)

        def resolve(self, repo_id: str, revision: str, filename: str, body: bool) -> None:
            found = self.found(repo_id, revision, body)
            if found is None:
                return
            _, commit = found
            content = commit.files.get(filename)
            if content is None:
                self.reply(404, {"error": f"Entry not found: {filename}"}, body,
                           {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit.id})
                return
            self.send_response(200)
            self.send_header("X-Repo-Commit", commit.id)
            self.send_header("ETag", f'"{hashlib.sha256(content).hexdigest()}"')
            self.send_header("Content-Length", str(len(content)))
            self.send_header("Content-Type", "application/octet-stream")
            self.end_headers()
            if body:
                self.wfile.write(content)

        def reply(self, status: int, payload: object, body: bool,
                  headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)

    return Handler
