"""`ServerEngine` (`rollout/engine=vllm_server`): the engine contract on paravt rollout servers.

The trainer's process imports no vLLM here: requests go over HTTP (stdlib) to one or more
servers (`paravt serve-rollout`, `paravt.rollout.serving.server`), given as URLs or started by the
factory. Each server hosts the in-process vLLM engine, so a server's rollouts are those of
`rollout/engine=vllm` (same request building, same expansion check, same seeds: each request
carries its own, `request_seeds`, resolved before the call is split over the servers).

Several servers: `paravt.rollout.serving.routing.Router` keeps a trajectory's turns on one
server and spreads new groups by the work in flight; each server's share is sent at once, the
shares in parallel. A server that fails (connection refused or reset, an engine error) fails
the whole call with an error naming its URL and its /health: the step's rollouts are discarded
before anything trains on them.

Weights: `sync_weights` writes the policy's full weights into a folder both sides see
(`rollout.engine.sync_dir`; default a fresh folder in /dev/shm, else the temp dir), checks the
folder against the model (`paravt.rollout.serving.checkpoint`: a partial or mismatched one is
refused before any server sees it), then every server runs `SYNC_PLAN` (pause -> load -> the
three cache resets -> version -> resume) and reports the steps it ran and its version, both
checked, and /version is read back. `last_sync_s` times the whole (`time/sync`).

Versions only move forward on a server: a sync to an older version than the server holds
(another client synced it further) is skipped and the newer version adopted. Every output
carries the version its server answered under (`GenerationOutput.version`; one call on one
server runs under one version), which the agent loop records for its tokens: two servers in one
call may hold different versions. The engine's own version is the oldest any of its servers
may still sample with, so a caller that records it before a run never under-counts staleness;
a server that reports an older version than it did before (restarted) is an error.

Under a multi-rank trainer (FSDP2 under Lightning, torchrun or srun) every rank has its own
`ServerEngine` on the same servers and generates its own share of the groups through them. The
servers are started once, by rank 0 (`paravt.rollout.factory`), and their URLs reach the other
ranks through the live process group (`on_rank0`, an object broadcast: no port file, no reliance
on RANK being exported). A weight sync is one per step, whatever the world size: every rank
joins the gather (a collective under FSDP2), rank 0 alone writes the checkpoint and drives
each server's reload, and its outcome (the new version, or the error) is broadcast, which is
also the barrier before anyone generates again. A step's rollouts end with `settle`: every rank
learns whether any rank's failed (a dead server), so all raise instead of one rank raising while
the others wait in the training step's collectives; the ranks also agree there on the newest
version a server answered with, so their sync decisions stay identical. Routing stays per rank
(each rank balances its own groups); ranks break ties from server `rank mod M`, so one group
per rank still spreads over M servers.
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

from paravt.parallel.collectives import all_gather_object, on_rank0
from paravt.parallel.distributed import Rank
from paravt.rollout.engine import (
    EngineConfig,
    GenerationOutput,
    GenerationRequest,
    SamplingParams,
    request_seeds,
)
from paravt.rollout.serving.checkpoint import check_checkpoint, model_manifest, write_checkpoint
from paravt.rollout.serving.nccl import sender_for
from paravt.rollout.serving.protocol import (
    SYNC_PLAN,
    decode_output,
    encode_params,
    encode_request,
)
from paravt.rollout.serving.routing import Router


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
        self,
        urls: Sequence[str],
        cfg: EngineConfig,
        processes: Sequence = (),
        manifest=None,
        started: bool | None = None,
    ):
        """`processes`: the servers this process started; `manifest`: name -> shape of the
        model's tensors (`model_manifest`), which every checkpoint must match (None: taken from
        the policy at the first sync); `started`: whether paravt started the servers on the
        trainer's initial weights (default: whether this process did; rank 0 starts them for
        every rank)."""
        self.urls = tuple(u.rstrip("/") for u in urls)
        self.cfg, self.processes = cfg, list(processes)
        self.rank = Rank.current()  # the live process group's, not what the launcher exported
        self.router = Router(self.urls, first=self.rank.rank)
        self.pool = ThreadPoolExecutor(max_workers=len(self.urls), thread_name_prefix="paravt-rs")
        self._own_sync_dir = not cfg.sync_dir and self.lead  # only rank 0 writes checkpoints
        self.sync_dir = Path(cfg.sync_dir or default_sync_dir()) if self.lead else None
        if self._own_sync_dir:  # tmpfs holds RAM: never left behind
            atexit.register(shutil.rmtree, self.sync_dir, True)
        self._manifest = manifest
        self.last_sync_s = 0.0
        self._nccl = sender_for(self)  # weight_transfer=nccl (None: checkpoint), serving.nccl
        for url in self.urls:
            self._check_health(url)
        # Servers paravt did not start hold weights it cannot vouch for (another checkpoint,
        # another run's version): version -1 until the first sync, which loads the policy
        # whatever their version says (`needs_sync`: the trainer syncs before rollouts).
        self._force = not (bool(self.processes) if started is None else started)
        versions = [self._get(u, "/version")["version"] for u in self.urls]
        self._version = -1 if self._force else min(versions)
        self._floor = dict(zip(self.urls, versions, strict=True))  # what each last reported

    def leave_nccl_to_generator(self) -> None:
        """With rollout.mode=async the generator's engine (`child_config`, the same servers) is
        each server's one NCCL sender; this, the trainer's engine, then syncs by checkpoint (a
        held-out evaluation, a too-stale step): a second sender's group would orphan the
        generator's and hang both (issue 50, finding 2)."""
        self._nccl = None

    @property
    def lead(self) -> bool:
        """Whether this process writes checkpoints and drives the servers' reload (rank 0)."""
        return self.rank.rank == 0

    @property
    def spans_ranks(self) -> bool:
        """Whether the trainer's ranks share these servers (a multi-rank trainer)."""
        return self.rank.world_size > 1

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
        seeds = request_seeds(requests, params)  # here: not on the server a request reaches
        requests = [replace(r, seed=s) for r, s in zip(requests, seeds, strict=True)]
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
        """Write, check and load `policy`'s weights on every server as `version`.

        Under a multi-rank trainer every rank calls it at the same moment: each joins the
        gather, rank 0 alone writes and drives the reload, and every rank leaves with rank 0's
        outcome (the same new version, or the same error)."""
        if self._nccl is not None:  # weight_transfer=nccl: paravt.rollout.serving.nccl
            return self._nccl.sync(policy, version)
        import torch

        t0 = time.perf_counter()
        if self._manifest is None:  # every rank: a LoRA policy's merged names are a gather
            self._manifest = model_manifest(policy)
        folder = self.sync_dir / f"{os.getpid()}-v{version}" if self.lead else None
        failure = None
        try:  # folder None: this rank only joins the gather
            dtype, bucket = getattr(torch, self.cfg.dtype), self.cfg.sync_bucket_mb << 20
            write_checkpoint(policy, folder, dtype, bucket)
        except Exception as err:
            if not self.spans_ranks:
                raise
            failure = err  # rank 0 hands it to every rank below; never left in a collective
        self._version, floor = on_rank0(lambda: self._load_written(folder, version, failure))
        if failure is not None:
            raise failure
        self._floor, self._force = dict(floor), False
        self.last_sync_s = time.perf_counter() - t0

    def _load_written(
        self, folder: Path, version: int, failure: Exception | None
    ) -> tuple[int, dict[str, int]]:
        """Rank 0: check the written folder, load it on every server; (the oldest version they
        hold, each one's)."""
        if failure is not None:
            raise failure
        check_checkpoint(folder, self._manifest)
        self.load_checkpoint(folder, version)
        for old in self.sync_dir.glob(f"{os.getpid()}-v*"):
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)
        return self._version, self._floor

    def settle(self, error: BaseException | None) -> None:
        """After a step's (or an evaluation's) rollouts on every rank of a multi-rank trainer:
        when any rank's failed (`error` on that rank, which raises its own afterwards), every
        other rank raises a `RolloutServerError` quoting it, so none goes on into a collective
        its peers never reach; and the ranks pool what each server's answers said of its
        version (another client may have synced it), so their versions, and with them their
        sync decisions, stay identical. One process: nothing to agree on."""
        if not self.spans_ranks:
            return
        mine = (None if error is None else f"{type(error).__name__}: {error}", self._floor)
        got = all_gather_object(mine)
        self._floor = {u: max(floor[u] for _, floor in got) for u in self.urls}
        self._version = max(self._version, min(self._floor.values()))
        failed = [(r, msg) for r, (msg, _) in enumerate(got) if msg is not None]
        if failed and error is None:
            rank, msg = failed[0]
            raise RolloutServerError(
                f"trainer rank {rank}'s rollouts failed, so rank {self.rank.rank} stops the "
                f"step too (nothing is trained on it): {msg}"
            )

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
        self._floor = held

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
            "requests": [encode_request(r) for r in share],
            "params": encode_params(params),
        }
        self.router.start(url, work)
        try:
            got = self._post(url, "/generate", body)
        finally:
            self.router.finish(url, work)
        version = int(got["version"])  # the server's own: one call runs under one version
        self._adopt(url, version)
        outputs = got["outputs"]
        return [[replace(decode_output(o), version=version) for o in outs] for outs in outputs]

    def _adopt(self, url: str, version: int) -> None:
        """A server answered under `version`: it may have moved on (another client synced it),
        never back. The engine's version becomes the oldest any server may still sample with,
        so a run that records it before starting never under-counts its staleness."""
        if version < self._floor[url]:
            raise RolloutServerError(
                f"rollout server {url} samples with weight version {version}, older than the "
                f"{self._floor[url]} it reported before: was it restarted? Its rollouts are not "
                "used"
            )
        self._floor[url] = version
        if not self.spans_ranks:  # several ranks pool their servers' answers in `settle`
            self._version = max(self._version, min(self._floor.values()))

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
