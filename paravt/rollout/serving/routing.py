"""Which rollout server continues which request: pure bookkeeping, no HTTP.

Rules:
- a trajectory's later turns go to the server of its earlier ones (that server's prefix cache
  holds the context); a request continues a trajectory when it carries the trajectory's name and
  its ids start with the context last sent under that name;
- a new group (requests named "<anything> <sample id>#<g>" sharing the part before '#') goes
  whole to the server with the least work in flight, so the G copies of a prompt share that
  server's prefix cache; unnamed requests (sub-agent calls) are placed one by one the same way;
- work is counted in tokens: the context plus the new tokens asked for, added when a batch is
  sent and removed when it returns (or fails), so concurrent callers see each other's load;
- ties go to the first server from `first` on (the trainer rank mod M): each rank of a
  multi-rank trainer counts only its own work, and without the rotation every rank would send
  its first group to the same server.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from paravt.rollout.engine import GenerationRequest


def group_key(name: str) -> str | None:
    """The group a named request belongs to (its name up to the last '#'); None if unnamed."""
    if not name:
        return None
    return name.rsplit("#", 1)[0] if "#" in name else name


class Router:
    """Assigns requests to server URLs and tracks the work each has in flight."""

    def __init__(self, urls: Sequence[str], first: int = 0):
        if not urls:
            raise ValueError("a Router needs at least one server URL")
        self.urls = tuple(urls)
        n = len(self.urls)
        self.order = {u: (i - first) % n for i, u in enumerate(self.urls)}  # tie-break rank
        self.in_flight = dict.fromkeys(self.urls, 0)
        self.home: dict[str, tuple[str, int, int]] = {}  # name -> (url, context len, its hash)
        self.lock = threading.Lock()

    def _continues(self, req: GenerationRequest) -> str | None:
        known = self.home.get(req.name) if req.name else None
        if known is None:
            return None
        url, n, digest = known
        if len(req.token_ids) >= n and hash(req.token_ids[:n]) == digest:
            return url
        return None

    def least_loaded(self, extra: dict[str, int] | None = None) -> str:
        extra = extra or {}
        return min(self.urls, key=lambda u: (self.in_flight[u] + extra.get(u, 0), self.order[u]))

    def assign(self, requests: Sequence[GenerationRequest], new_tokens: int) -> list[str]:
        """The server of each request (same order); records each named request's context."""
        with self.lock:
            placed: dict[str, int] = {}  # work placed by this call, per url
            groups: dict[str, str] = {}  # group key -> url, for this call's new groups
            out = []
            for req in requests:
                url = self._continues(req)
                key = group_key(req.name)
                if url is None and key is not None:
                    url = groups.get(key)
                if url is None:
                    url = self.least_loaded(placed)
                if key is not None:
                    groups.setdefault(key, url)
                placed[url] = placed.get(url, 0) + len(req.token_ids) + new_tokens
                out.append(url)
                if req.name:
                    self.home[req.name] = (url, len(req.token_ids), hash(req.token_ids))
            return out

    def start(self, url: str, work: int) -> None:
        with self.lock:
            self.in_flight[url] += work

    def finish(self, url: str, work: int) -> None:
        with self.lock:
            self.in_flight[url] -= work

    def forget(self, url: str) -> None:
        """Drop every trajectory placed on `url` (a server that failed)."""
        with self.lock:
            self.home = {k: v for k, v in self.home.items() if v[0] != url}
