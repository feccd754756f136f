"""A stand-in for the Hugging Face Hub, for tests only: the Hub cannot be reached from here.

This is the one stand-in for a remote service in the suite, kept to the four endpoints ``huggingface_hub``
uses to create a repository and commit files to it: ``POST /api/repos/create``, ``POST /api/validate-yaml``
(the model card's metadata header must parse),
``POST /api/models/<repo>/preupload/<rev>`` (every file is declared a regular upload, so its content travels
inside the commit) and ``POST /api/models/<repo>/commit/<rev>`` (NDJSON: a header, then base64 files); the same two
under ``/api/datasets/`` for a dataset repository. A model repository's files can be read back as ``from_pretrained``
reads them: ``GET``/``HEAD /<repo>/resolve/<rev>/<file>`` and the listings ``/api/models/<repo>[/revision/<rev>]``,
``/api/models/<repo>/tree/<rev>[/<folder>]`` (the repository as its commits left it, whatever the revision). Any other
request is answered 404 and recorded, so a test sees it. ``FakeHub.fail_next`` makes the next requests fail as the
Hub or the network can: a 5xx, a 429 rate limit, or a connection dropped without an answer.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml


@dataclass
class Commit:
    repo_id: str
    message: str
    files: dict[str, bytes]
    repo_type: str = "model"


@dataclass
class FakeHub:
    url: str = ""
    repos: dict[str, dict] = field(default_factory=dict)
    commits: list[Commit] = field(default_factory=list)
    authorizations: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    card_metadata: list[dict] = field(default_factory=list)
    failures: list[list] = field(default_factory=list)  # [how, path part, requests to let through first]
    failed: list[str] = field(default_factory=list)  # the requests that failed, as "POST <path> -> <how>"

    def fail_next(self, times: int, how: int | str = 500, path: str = "", after: int = 0) -> None:
        """Fail the next ``times`` POST requests whose path contains ``path`` (after letting ``after`` of them
        through): with an HTTP status (500, 503, 429; 401, 403: a refused token) or ``"drop"`` (the connection is
        closed without an answer). huggingface_hub retries a failed commit itself (1 s, 2 s, 4 s, ...), not a
        repository creation."""
        self.failures.append([how, path, after])
        self.failures.extend([how, path, 0] for _ in range(times - 1))

    def failure_for(self, path: str) -> int | str | None:
        """How this request fails, if it does."""
        if not self.failures or self.failures[0][1] not in path:
            return None
        if self.failures[0][2] > 0:
            self.failures[0][2] -= 1
            return None
        return self.failures.pop(0)[0]

    def files(self, repo_id: str) -> dict[str, bytes]:
        """The repository's files after all its commits."""
        tree = {}
        for commit in self.commits:
            if commit.repo_id == repo_id:
                tree.update(commit.files)
        return tree


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # keep test output clean
            pass

        def _reply(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self._download(body=True) or self._listing():
                return
            if not self.path.startswith("/api/agent-harnesses"):  # huggingface_hub's user-agent registry: optional
                hub.unexpected.append(f"GET {self.path}")
            self._reply(404, {"error": "not in the stand-in"})

        def do_HEAD(self):
            if not self._download(body=False):
                hub.unexpected.append(f"HEAD {self.path}")
                self._reply(404, {"error": "not in the stand-in"})

        def _listing(self) -> bool:
            """``/api/models/<repo>[/revision/<rev>]`` (its info: commit, files) and
            ``/api/models/<repo>/tree/<rev>[/<folder>]`` (the files under a folder), which transformers reads when it
            loads a tokenizer."""
            path = self.path.split("?")[0]
            match = re.fullmatch(r"/api/models/(.+?)(?:/revision/[^/]+|/tree/[^/]+(/.*)?)?", path)
            files = hub.files(match.group(1)) if match else {}
            if not files:
                return False
            sha = f"{len(hub.commits):040x}"
            if "/tree/" not in path:
                siblings = [{"rfilename": name} for name in files]
                self._reply(200, {"id": match.group(1), "sha": sha, "siblings": siblings, "tags": []})
                return True
            folder = (match.group(2) or "").strip("/")
            inside = [name for name in files if not folder or name.startswith(folder + "/")]
            if folder and not inside:
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return True
            entries = [{"type": "file", "path": name, "size": len(files[name]), "oid": sha} for name in inside]
            self._reply(200, entries)
            return True

        def _download(self, body: bool) -> bool:
            """``/<repo>/resolve/<revision>/<file>``: a file of a model repository as its commits left it, with the
            headers ``hf_hub_download`` reads (commit, ETag, size); a missing one is ``EntryNotFound``."""
            match = re.fullmatch(r"/(.+)/resolve/[^/]+/(.+)", self.path.split("?")[0])
            if match is None:
                return False
            repo_id, name = match.groups()
            files = hub.files(repo_id)
            if not files or name not in files:
                self.send_response(404)
                known = files or repo_id in hub.repos
                self.send_header("X-Error-Code", "EntryNotFound" if known else "RepoNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return True
            data = files[name]
            self.send_response(200)
            self.send_header("X-Repo-Commit", f"{len(hub.commits):040x}")
            self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)
            return True

        def _fail(self, how: int | str) -> None:
            hub.failed.append(f"POST {self.path.split('?')[0]} -> {how}")
            if how == "drop":
                self.close_connection = True  # no status line: the client sees the connection closed
                return
            self.send_response(how)
            if how == 429:
                self.send_header("Retry-After", "1")
            error = {429: "rate limited", 401: "Invalid credentials in Authorization header", 403: "no write access"}
            data = json.dumps({"error": error.get(how, "internal error")}).encode()
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            hub.authorizations.append(self.headers.get("authorization", ""))
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            path = self.path.split("?")[0]
            if (how := hub.failure_for(path)) is not None:
                return self._fail(how)
            if path == "/api/repos/create":
                request = json.loads(body)
                repo_id = (
                    f"{request['organization']}/{request['name']}" if request.get("organization") else request["name"]
                )
                hub.repos[repo_id] = {"visibility": request.get("visibility"), "type": request.get("type", "model")}
                return self._reply(200, {"url": f"{hub.url}/{repo_id}", "name": repo_id})
            if path == "/api/validate-yaml":  # the README's metadata header must parse, as the Hub checks
                content = json.loads(body)["content"]
                header = content.split("---")[1] if content.startswith("---") else ""
                try:
                    metadata = yaml.safe_load(header)
                except yaml.YAMLError as err:
                    return self._reply(400, {"errors": [{"message": str(err)}]})
                hub.card_metadata.append(metadata)
                return self._reply(200, {"errors": [], "warnings": []})
            if match := re.fullmatch(r"/api/(?:models|datasets)/(.+)/preupload/[^/]+", path):
                files = json.loads(body)["files"]
                regular = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]
                return self._reply(200, {"files": regular})
            if match := re.fullmatch(r"/api/(models|datasets)/(.+)/commit/[^/]+", path):
                lines = [json.loads(line) for line in body.splitlines() if line.strip()]
                header = next(line["value"] for line in lines if line["key"] == "header")
                files = {
                    line["value"]["path"]: base64.b64decode(line["value"]["content"])
                    for line in lines
                    if line["key"] == "file"
                }
                kind, repo_id = match.group(1).removesuffix("s"), match.group(2)
                hub.commits.append(Commit(repo_id, header["summary"], files, kind))
                oid = f"{len(hub.commits):040x}"
                return self._reply(200, {"commitUrl": f"{hub.url}/{repo_id}/commit/{oid}", "commitOid": oid})
            hub.unexpected.append(f"POST {path}")
            return self._reply(404, {"error": "not in the stand-in"})

    return Handler


def start() -> tuple[FakeHub, ThreadingHTTPServer]:
    hub = FakeHub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return hub, server
