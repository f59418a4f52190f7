"""`ServerEngine` (`rollout/engine=vllm_server`): the engine contract on paravt rollout servers.

The trainer's process imports no vLLM here: requests go over HTTP (stdlib) to one or more
servers (`paravt serve-rollout`, `paravt.rollout.server`), given as URLs or started by the
factory. Each server hosts the in-process vLLM engine, so a server's rollouts are those of
`rollout/engine=vllm` (same request building, same expansion check, same seeds: each request
carries its position in the caller's batch).

Several servers: `paravt.rollout.server_routing.Router` keeps a trajectory's turns on one
server and spreads new groups by the work in flight; each server's share is sent at once, the
shares in parallel. A server that fails (connection refused or reset, an engine error) fails
the whole call with an error naming its URL and its /health: the step's rollouts are discarded
before anything trains on them.

Weights: `sync_weights` writes the policy's full weights into a folder both sides see
(`rollout.engine.sync_dir`; default a fresh folder in /dev/shm, else the temp dir), checks the
folder against the model (`paravt.rollout.server_checkpoint`: a partial or mismatched one is
refused before any server sees it), then every server runs `SYNC_PLAN` (pause -> load -> the
three cache resets -> version -> resume) and reports the steps it ran and its version, both
checked, and /version is read back. `last_sync_s` times the whole (`time/sync`).

Versions only move forward on a server: a sync to an older version than the server holds
(another client synced it further) is skipped and the newer version adopted, and a generate
answered under a newer version adopts it. A caller that records the version before a run thus
records the oldest weights any of its tokens were sampled with (staleness is never under-
counted); a server that went back (restarted) is an error.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from paravt.errors import UserError
from paravt.rollout.engine import (
    EngineConfig,
    GenerationOutput,
    GenerationRequest,
    SamplingParams,
)
from paravt.rollout.server_checkpoint import check_checkpoint, model_manifest, write_checkpoint
from paravt.rollout.server_nccl import sender_for
from paravt.rollout.server_protocol import (
    SYNC_PLAN,
    decode_output,
    encode_params,
    encode_request,
)
from paravt.rollout.server_routing import Router


class RolloutServerError(RuntimeError):
    """A rollout server failed or answered out of contract; the message names its URL."""


def default_sync_dir() -> str:
    shm = Path("/dev/shm")
    base = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
    return tempfile.mkdtemp(prefix="paravt_sync_", dir=base)


def http_json(url: str, body: dict | None = None, timeout_s: float = 60.0) -> tuple[int, dict]:
    """(status, JSON body) of a GET (body None) or POST; raises OSError when unreachable."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        with contextlib.suppress(ValueError):
            return err.code, json.loads(err.read())
        return err.code, {"error": str(err)}


class ServerEngine:
    """`RolloutEngine` over rollout servers; see the module docstring."""

    def __init__(
        self, urls: Sequence[str], cfg: EngineConfig, processes: Sequence = (), manifest=None
    ):
        """`processes`: the servers this engine started (on the trainer's initial weights);
        `manifest`: name -> shape of the model's tensors (`model_manifest`), which every
        checkpoint must match (None: taken from the policy at the first sync)."""
        self.urls = tuple(u.rstrip("/") for u in urls)
        self.cfg, self.processes = cfg, list(processes)
        self.router = Router(self.urls)
        self.pool = ThreadPoolExecutor(max_workers=len(self.urls), thread_name_prefix="paravt-rs")
        self.sync_dir = Path(cfg.sync_dir or default_sync_dir())
        self._own_sync_dir = not cfg.sync_dir
        if self._own_sync_dir:  # tmpfs holds RAM: never left behind
            atexit.register(shutil.rmtree, self.sync_dir, True)
        self._manifest = manifest
        self.last_sync_s = 0.0
        self._nccl = sender_for(self)  # weight_transfer=nccl (None: checkpoint), server_nccl
        for url in self.urls:
            self._check_health(url)
        # Servers this engine did not start hold weights it cannot vouch for (another
        # checkpoint, another run's version): version -1 until the first sync, which loads the
        # policy whatever their version says (`needs_sync`: the trainer syncs before rollouts).
        self._force = not self.processes
        versions = [self._get(u, "/version")["version"] for u in self.urls]
        self._version = -1 if self._force else min(versions)

    @property
    def child_config(self) -> EngineConfig:
        """This engine's config with its servers' URLs: another process (rollout.mode=async's
        generator) connects to the same servers instead of starting its own."""
        return replace(self.cfg, server_urls=self.urls)

    # ---- RolloutEngine ----------------------------------------------------------------------
    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def needs_sync(self) -> bool:
        """Whether the servers must be given the policy before they generate for it."""
        return self._force

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[list[GenerationOutput]]:
        if not requests:
            return []
        homes = self.router.assign(requests, params.max_new_tokens * params.n)
        shares: dict[str, list[int]] = {}
        for i, url in enumerate(homes):
            shares.setdefault(url, []).append(i)
        futures = {
            url: self.pool.submit(self._generate_on, url, idx, requests, params)
            for url, idx in shares.items()
        }
        errors, results = [], [None] * len(requests)
        for url, future in futures.items():  # every share finishes (or fails) before raising
            try:
                for i, out in zip(shares[url], future.result(), strict=True):
                    results[i] = out
            except Exception as err:
                self.router.forget(url)
                errors.append(err)
        if errors:
            raise errors[0]
        return results

    def sync_weights(self, policy, version: int) -> None:
        """Write, check and load `policy`'s weights on every server as `version`."""
        if self._nccl is not None:  # weight_transfer=nccl: paravt.rollout.server_nccl
            return self._nccl.sync(policy, version)
        import torch

        t0 = time.perf_counter()
        folder = self.sync_dir / f"{os.getpid()}-v{version}"
        write_checkpoint(
            policy, folder, getattr(torch, self.cfg.dtype), self.cfg.sync_bucket_mb << 20
        )
        if self._manifest is None:
            self._manifest = model_manifest(policy)
        check_checkpoint(folder, self._manifest)
        self.load_checkpoint(folder, version)
        for old in self.sync_dir.glob(f"{os.getpid()}-v*"):
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)
        self.last_sync_s = time.perf_counter() - t0

    # ---- servers ----------------------------------------------------------------------------
    def load_checkpoint(self, folder: str | Path, version: int, plan=SYNC_PLAN) -> None:
        """Every server loads the (already checked) `folder` as `version` by `plan`; the steps
        each reports and its /version afterwards are checked."""
        body = {"path": str(folder), "version": int(version), "plan": list(plan)}
        body["force"] = self._force  # servers not started here: load even an older version
        futures = {u: self.pool.submit(self._post, u, "/sync_weights", body) for u in self.urls}
        answers = {u: f.result() for u, f in futures.items()}
        for url, got in answers.items():
            if got.get("skipped"):
                continue  # the server already holds newer weights (another client's sync)
            if tuple(got["steps"]) != SYNC_PLAN or got["version"] != version:
                raise RolloutServerError(
                    f"rollout server {url} ran weight-sync steps {got['steps']} to version "
                    f"{got['version']}; expected {list(SYNC_PLAN)} to version {version}"
                )
        held = {u: self._get(u, "/version")["version"] for u in self.urls}
        behind = {u: v for u, v in held.items() if v < version or (body["force"] and v != version)}
        if behind:
            raise RolloutServerError(
                f"rollout servers {behind} report another weight version than {version} after "
                "the sync"
            )
        self._version, self._force = min(held.values()), False

    def close(self) -> None:
        """Stop the servers this engine started and remove its sync folder."""
        for server in self.processes:
            server.stop()
        self.processes.clear()
        self.pool.shutdown(wait=False)
        if self._own_sync_dir:
            shutil.rmtree(self.sync_dir, ignore_errors=True)

    def _generate_on(
        self, url: str, idx: Sequence[int], requests: Sequence[GenerationRequest], params
    ) -> list[list[GenerationOutput]]:
        share = [requests[i] for i in idx]
        work = sum(len(r.token_ids) for r in share) + len(share) * params.max_new_tokens * params.n
        body = {
            "requests": [encode_request(r, i) for r, i in zip(share, idx, strict=True)],
            "params": encode_params(params),
        }
        self.router.start(url, work)
        try:
            got = self._post(url, "/generate", body)
        finally:
            self.router.finish(url, work)
        self._adopt(url, int(got["version"]))
        return [[decode_output(o) for o in outs] for outs in got["outputs"]]

    def _adopt(self, url: str, version: int) -> None:
        if version < self._version:
            raise RolloutServerError(
                f"rollout server {url} samples with weight version {version}, older than this "
                f"engine's {self._version}: was it restarted? Its rollouts are not used"
            )
        self._version = max(self._version, version)

    def _check_health(self, url: str) -> None:
        status = self._health(url)
        if status != "ok":
            raise RolloutServerError(
                f"rollout server {url} is not healthy ({status}): start it with `paravt "
                "serve-rollout --model DIR --port P` or fix rollout.engine.server_urls"
            )

    def _health(self, url: str) -> str:
        try:
            status, body = http_json(f"{url}/health", timeout_s=5.0)
        except OSError as err:
            return f"unreachable: {err}"
        return "ok" if status == 200 else f"/health {status}: {body.get('error', body)}"

    def _get(self, url: str, route: str) -> dict[str, Any]:
        return self._post(url, route, None)

    def _post(self, url: str, route: str, body: dict | None) -> dict[str, Any]:
        try:
            status, got = http_json(f"{url}{route}", body, self.cfg.server_request_timeout_s)
        except OSError as err:  # refused, reset, timed out: the server (or its host) is gone
            raise RolloutServerError(
                f"rollout server {url} failed during {route} ({type(err).__name__}: {err}); "
                f"its /health: {self._health(url)}. The step's rollouts are discarded, nothing "
                "was trained on them"
            ) from err
        if status == 400:
            raise ValueError(f"rollout server {url} refused {route}: {got.get('error')}")
        if status != 200:
            raise RolloutServerError(
                f"rollout server {url} failed during {route} (HTTP {status}): "
                f"{got.get('error', got)}"
            )
        return got


def check_world(world: int) -> None:
    """One trainer process per set of servers (a multi-rank trainer is not supported yet)."""
    if world > 1:
        raise UserError(
            f"rollout/engine=vllm_server under a {world}-rank trainer launch is not supported "
            "yet: run the trainer as one process, or use rollout/engine=vllm (one engine per rank)"
        )
