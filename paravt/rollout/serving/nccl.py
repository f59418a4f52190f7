"""Rollout servers' weight sync over NCCL (`rollout.engine.weight_transfer: nccl`, GPUs only).

The default sync (`weight_transfer: checkpoint`, `paravt.rollout.serving.checkpoint`) writes a
full checkpoint to a folder both sides see. On GPUs this module sends the weights instead with
vLLM's own weight transfer: the trainer's global rank 0 broadcasts them to the servers' workers
in one NCCL group (vLLM's `NCCLTrainerWeightTransferEngine` on the trainer, its
`NCCLWeightTransferEngine` inside each server's engine, started with
`weight_transfer_config={"backend": "nccl"}`), with no disk in between.

The plan is the checkpoint path's `SYNC_PLAN`, split over the routes vLLM's trainer engine
drives (`start_weight_update`, `update_weights`, `finish_weight_update`):

    /weight_transfer/start    plan checked, pause (the engine lock), vLLM's start_weight_update
    /weight_transfer/update   the metadata checked against the server's model, then vLLM's
                              update_weights (it receives while the trainer broadcasts)
    /weight_transfer/finish   vLLM's finish_weight_update (the load done), the three cache
                              resets, the new version, resume; answers the steps it ran

and the trainer checks each server's steps and reads /version back, as after a checkpoint.
Before anything is sent the trainer checks its parameter metadata (names, wire dtypes, shapes;
`param_metadata`, built from the policy) against what each server's model expects
(`server_manifest`: its checkpoint folder's tensors and serving dtype): once the broadcast has
begun, a mismatch would hang both sides in NCCL or load garbage.

Several servers join one group: server i's workers take ranks 1 + i x tp ..., the trainer's
sender rank 0, so one broadcast reaches them all. Every trainer rank runs the gather
(`paravt.rollout.sync.weight_sync.iter_weights`, a collective under FSDP2); only global rank 0
talks to the servers and broadcasts. The trainer imports vLLM only here, lazily, at the first
sync in this mode; the checkpoint mode never imports it.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paravt.errors import UserError
from paravt.rollout.serving.protocol import SYNC_PLAN, check_sync_plan

MODES = ("checkpoint", "nccl")
ROUTE = "/weight_transfer"  # the server's routes: ROUTE + "/manifest", "/init", "/start", ...
# Names a checkpoint folder may leave out when the model ties them to the input embedding
# (save_pretrained drops the tied copy; vLLM's loader skips it when sent).
TIED_NAMES = ("lm_head.weight",)


@dataclass(frozen=True)
class ParamMeta:
    """One tensor as it goes over the wire: its name, dtype name (torch's) and full shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]


# ---- configuration ---------------------------------------------------------------------------
def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(
            f"rollout.engine.weight_transfer={mode!r} is not one of {list(MODES)}: 'checkpoint' "
            "(a full checkpoint on shared disk or tmpfs, any device) or 'nccl' (vLLM's NCCL "
            "weight transfer, GPUs only)"
        )


def check_cuda(mode: str, cuda: bool | None = None) -> None:
    """Refuse `nccl` where there is no CUDA device (on the trainer and on each server); `cuda`
    None: `paravt.parallel.placement.gpu_placement` (PARAVT_ASSUME_GPU=1 takes the GPU side)."""
    check_mode(mode)
    if mode != "nccl":
        return
    if cuda is None:
        from paravt.parallel.placement import gpu_placement

        cuda = gpu_placement()
    if not cuda:
        raise UserError(
            "rollout.engine.weight_transfer=nccl needs CUDA GPUs on the trainer and on the "
            "rollout servers (vLLM's NCCL weight transfer); none is visible here. Use "
            "rollout.engine.weight_transfer=checkpoint (a full checkpoint on shared disk or "
            "tmpfs), which runs anywhere"
        )


def import_vllm_trainer_engine():
    """vLLM's trainer-side NCCL engine and its init info, or a clear error without vLLM."""
    try:
        from vllm.distributed.weight_transfer.nccl_engine import (
            NCCLTrainerInitInfo,
            NCCLTrainerWeightTransferEngine,
        )
    except ImportError as err:
        raise UserError(
            "rollout.engine.weight_transfer=nccl sends the weights with vLLM's trainer-side "
            f"NCCL engine, but the trainer's environment has no vLLM ({err}): install vLLM "
            "beside the trainer (`pip install -e '.[vllm]'`), or use "
            "rollout.engine.weight_transfer=checkpoint"
        ) from err
    return NCCLTrainerInitInfo, NCCLTrainerWeightTransferEngine


# ---- what is sent, and what a server expects --------------------------------------------------
def wire_dtype(tensor_dtype, dtype) -> str:
    """The dtype a tensor is sent at: `dtype` for floating-point ones (as `iter_weights`
    casts them), its own otherwise."""
    return str(dtype if tensor_dtype.is_floating_point else tensor_dtype).removeprefix("torch.")


def param_metadata(policy, dtype) -> list[ParamMeta]:
    """What `iter_weights(policy, dtype=dtype)` yields, in its order, without a gather when it
    can: an unsharded or FSDP2 policy's state dict (DTensors give their global shapes); a LoRA
    policy's merged names are known only by merging, so it runs one gather."""
    from paravt.models.lora import is_lora

    if is_lora(policy):
        from paravt.rollout.sync.weight_sync import iter_weights

        items = [
            (n, t.dtype, t.shape) for b in iter_weights(policy, 256 << 20, "cpu") for n, t in b
        ]
    else:
        items = [(n, t.dtype, t.shape) for n, t in policy.state_dict().items()]
    return [
        ParamMeta(n, wire_dtype(d, dtype), tuple(int(s) for s in shape)) for n, d, shape in items
    ]


def server_manifest(model_dir: str | Path, dtype: str) -> dict[str, Any]:
    """What a server's model expects: the tensors of the checkpoint folder it was started on
    (name -> shape, read from the safetensors headers), its serving dtype, and the names it may
    lack because the model ties them."""
    from paravt.rollout.serving.checkpoint import read_headers

    config = json.loads((Path(model_dir) / "config.json").read_text())
    tied = config.get("tie_word_embeddings") or config.get("text_config", {}).get(
        "tie_word_embeddings"
    )
    tensors = {n: list(s) for n, s in read_headers(model_dir).items()}
    return {"tensors": tensors, "dtype": dtype, "optional": list(TIED_NAMES) if tied else []}


def check_metadata(meta: Sequence[ParamMeta], manifest: Mapping[str, Any], where: str) -> None:
    """Refuse sending `meta` to a server whose model expects `manifest`, naming the difference:
    a tensor it expects and would not get (partial), one it does not have (another model),
    another shape, or a floating-point dtype other than the one it serves."""
    want = {n: tuple(s) for n, s in manifest["tensors"].items()}
    have = {m.name: m for m in meta}
    missing = sorted(set(want) - set(have))
    if missing:
        raise ValueError(
            f"{where}: the policy lacks {len(missing)} of the {len(want)} tensors the server's "
            f"model expects (e.g. {missing[:3]}): a partial update, refused before anything is sent"
        )
    extra = sorted(set(have) - set(want) - set(manifest.get("optional", ())))
    if extra:
        raise ValueError(
            f"{where}: the policy has {len(extra)} tensor(s) the server's model does not (e.g. "
            f"{extra[:3]}): the server runs another model; refused before anything is sent"
        )
    for m in meta:
        if m.name in want and m.shape != want[m.name]:
            raise ValueError(
                f"{where}: {m.name} has shape {list(m.shape)}, the server's model "
                f"{list(want[m.name])}: another model; refused before anything is sent"
            )
    floats = {m.dtype for m in meta if m.dtype.startswith(("float", "bfloat"))}
    if floats - {manifest["dtype"]}:
        raise ValueError(
            f"{where}: the weights would be sent as {sorted(floats)}, the server serves "
            f"{manifest['dtype']}: set rollout.engine.dtype to the servers' dtype"
        )


def update_info(meta: Sequence[ParamMeta]) -> dict[str, list]:
    """vLLM's NCCL update info (names, dtype names, shapes) of `meta`."""
    return {
        "names": [m.name for m in meta],
        "dtype_names": [m.dtype for m in meta],
        "shapes": [list(m.shape) for m in meta],
    }


def meta_of_update(info: Mapping[str, Any]) -> list[ParamMeta]:
    return [
        ParamMeta(n, d, tuple(s))
        for n, d, s in zip(info["names"], info["dtype_names"], info["shapes"], strict=True)
    ]


def iter_policy(policy, dtype, bucket_bytes: int, device) -> Iterator:
    """(name, full tensor on `device`, floating-point ones at `dtype`), in the order of
    `param_metadata`: the one gather (`iter_weights`), one bucket of full weights at a time."""
    from paravt.rollout.sync.weight_sync import iter_weights

    for bucket in iter_weights(policy, bucket_bytes, device, dtype):
        yield from ((n, t.contiguous()) for n, t in bucket)


def policy_source(policy, meta: Sequence[ParamMeta], dtype, bucket_bytes: int, device):
    """vLLM's `WeightSource` over `policy`: `meta` (`param_metadata`), and the gathered tensors
    in its order on `device` (vLLM checks each against the metadata as it sends)."""
    import torch
    from vllm.distributed.weight_transfer.base import ParamMeta as VllmMeta
    from vllm.distributed.weight_transfer.base import WeightSource

    declared = [VllmMeta(m.name, getattr(torch, m.dtype), m.shape) for m in meta]

    class PolicySource(WeightSource):
        def metadata(self):
            return declared

        def __iter__(self):
            return iter_policy(policy, dtype, bucket_bytes, device)

    return PolicySource()


# ---- the trainer's side -----------------------------------------------------------------------
class ServersClient:
    """vLLM's `VLLMWeightSyncClient` protocol over every rollout server at once: each call goes
    to all of them in parallel and returns when all answered. `init_weight_transfer_engine`
    gives server i the ranks after the servers before it; `finish_weight_update` carries the
    version and keeps each server's answer (`answers`)."""

    def __init__(self, engine, tp: int):
        self.engine, self.tp = engine, tp  # engine: the ServerEngine (its URLs, pool, _post)
        self.version = 0
        self.expect: dict[str, list] = {}  # this sync's update info, checked at start
        self.answers: dict[str, dict] = {}

    def _all(self, route: str, body_of) -> dict[str, dict]:
        e = self.engine
        futures = {
            u: e.pool.submit(e._post, u, f"{ROUTE}/{route}", body_of(i))
            for i, u in enumerate(e.urls)
        }
        return {u: f.result() for u, f in futures.items()}

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        def body(i):
            return {"init_info": init_info | {"rank_offset": 1 + i * self.tp}}

        self._all("init", body)

    def start_weight_update(self) -> None:
        body = {"version": self.version, "plan": list(SYNC_PLAN), "update_info": self.expect}
        self._all("start", lambda i: body)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self._all("update", lambda i: {"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.answers = self._all("finish", lambda i: {"version": self.version})

    def shutdown_weight_transfer_engine(self) -> None:
        self._all("shutdown", lambda i: {})

    def check_free(self) -> None:
        """Refuse to open a group while a server is in another sender's (`NcclReceiver.init`
        would refuse it too, but only after this side waits at the rendezvous)."""
        for url, got in self._all("group", lambda i: {}).items():
            if got.get("joined"):
                raise UserError(
                    f"rollout server {url} is already in another sender's weight-transfer "
                    f"group ({got['joined']}): one NCCL sender per server (with rollout.mode="
                    "async the generator's; the trainer's own syncs write a checkpoint)"
                )


def check_servers(engine, meta: Sequence[ParamMeta]) -> None:
    """Refuse `meta` unless every server's model expects it (`check_metadata` against its
    `/weight_transfer/manifest`), naming the server."""
    for url in engine.urls:
        got = engine._post(url, f"{ROUTE}/manifest", {})
        check_metadata(meta, got, f"rollout server {url}")


def _host_for(urls: Sequence[str], configured: str) -> str:
    """The address the servers reach the trainer's rank 0 at: `configured`, else loopback when
    every server is on this machine's loopback, else this host's address."""
    if configured:
        return configured
    hosts = {urllib.parse.urlsplit(u).hostname for u in urls}
    if hosts <= {"127.0.0.1", "localhost", "::1"}:
        return "127.0.0.1"
    return socket.gethostbyname(socket.gethostname())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class NcclSender:
    """The `nccl` weight sync of one `ServerEngine` (`sync`), on every trainer rank."""

    def __init__(self, engine):
        check_cuda(engine.cfg.weight_transfer)
        self.engine = engine
        self.client = ServersClient(engine, engine.cfg.tensor_parallel_size)
        self.transfer = None  # vLLM's trainer engine, from the first sync
        self.meta: list[ParamMeta] | None = None

    @staticmethod
    def rank() -> int:
        from paravt.parallel.distributed import Rank

        return Rank.current().rank

    def sync(self, policy, version: int) -> None:
        """Check the metadata against every server, then send `policy`'s weights as `version`
        by `SYNC_PLAN`; each server's steps and /version are checked afterwards."""
        import torch

        from paravt.parallel.collectives import on_rank0

        t0 = time.perf_counter()
        e, lead = self.engine, self.rank() == 0
        if self.meta is None:  # every rank (a LoRA policy's merged names are a gather)
            meta = param_metadata(policy, getattr(torch, e.cfg.dtype))
            on_rank0(lambda: check_servers(e, meta))  # a mismatch raises on every rank
            self.meta = meta  # only once every server accepted it
        self.client.version, self.client.expect = int(version), update_info(self.meta)
        failure = None
        try:
            self._engine(policy).send_weights()
        except Exception as err:  # handed to every rank below, never left in a collective
            failure = err
        e._version = on_rank0(lambda: self._finish(version, failure))
        if failure is not None and not lead:
            raise failure
        e._force = False
        e._floor = dict.fromkeys(e.urls, e._version)  # every server holds it (checked by rank 0)
        e.last_sync_s = time.perf_counter() - t0

    def _engine(self, policy):
        """vLLM's trainer engine over a source of `policy`'s weights (rendezvous at the first
        sync: rank 0 opens the group, the servers' workers join it)."""
        from paravt.parallel.collectives import on_rank0

        if self.transfer is None:
            on_rank0(self.client.check_free)  # every rank raises if one server is taken
        init_info_cls, engine_cls = import_vllm_trainer_engine()
        source = self._source(policy)
        if self.transfer is None:
            e = self.engine
            info = init_info_cls(
                master_address=_host_for(e.urls, e.cfg.weight_transfer_address),
                master_port=e.cfg.weight_transfer_port or _free_port(),
                world_size=1 + len(e.urls) * e.cfg.tensor_parallel_size,
                rank=self.rank(),
            )
            self.transfer = engine_cls.trainer_init(info, client=self.client, source=source)
        self.transfer.source = source  # this sync's policy (the async generator's copy moves)
        return self.transfer

    def _source(self, policy):
        import torch

        cfg = self.engine.cfg
        device = torch.device("cuda", torch.cuda.current_device())
        return policy_source(
            policy, self.meta, getattr(torch, cfg.dtype), cfg.sync_bucket_mb << 20, device
        )

    def _finish(self, version: int, failure: Exception | None) -> int:
        """Rank 0: every server ran `SYNC_PLAN` to `version` and reports it; the version held."""
        if failure is not None:
            raise failure
        e = self.engine
        for url, got in self.client.answers.items():
            if tuple(got["steps"]) != SYNC_PLAN or got["version"] != version:
                raise RuntimeError(
                    f"rollout server {url} ran weight-sync steps {got['steps']} to version "
                    f"{got['version']}; expected {list(SYNC_PLAN)} to version {version}"
                )
        held = {u: e._get(u, "/version")["version"] for u in e.urls}
        if any(v != version for v in held.values()):
            raise RuntimeError(f"rollout servers {held} hold another version than {version}")
        return version

    def close(self) -> None:
        if self.transfer is not None:
            self.transfer.shutdown()
            self.transfer = None


def sender_for(engine) -> NcclSender | None:
    """The `ServerEngine` hook: None for `checkpoint` (nothing changes, no vLLM import);
    for `nccl` the sender, refused at start-up without CUDA."""
    check_mode(engine.cfg.weight_transfer)
    return NcclSender(engine) if engine.cfg.weight_transfer == "nccl" else None


# ---- the server's side ------------------------------------------------------------------------
class NcclReceiver:
    """The `/weight_transfer/*` routes of a rollout server (`paravt.rollout.serving.server`): vLLM's
    worker-side weight transfer, inside `SYNC_PLAN` run by the server's own steps."""

    def __init__(self, service):
        self.service = service  # the RolloutService: its engine, lock and plan steps
        self.steps: list[str] = []  # the steps of the sync in progress
        self._manifest: dict | None = None
        self.t0 = 0.0
        self.group: str | None = None  # the sender's group this server joined, until shutdown

    def routes(self) -> dict[str, Any]:
        return {
            f"{ROUTE}/manifest": lambda body: self.manifest(),
            f"{ROUTE}/group": lambda body: {"joined": self.group},
            f"{ROUTE}/init": self.init,
            f"{ROUTE}/start": self.start,
            f"{ROUTE}/update": self.update,
            f"{ROUTE}/finish": self.finish,
            f"{ROUTE}/shutdown": self.shutdown,
        }

    @property
    def llm(self):
        return self.service.engine.llm

    def manifest(self) -> dict[str, Any]:
        if self._manifest is None:
            model_dir = self.llm.llm_engine.model_config.model
            self._manifest = server_manifest(model_dir, self.service.engine.cfg.dtype)
        return self._manifest

    def init(self, body: dict) -> dict:
        """Join the trainer's NCCL group (blocks until rank 0 opens it); under the engine lock,
        as no engine call may run beside a generate. A second sender is refused: vLLM's worker
        would silently replace its communicator, and the first sender's next broadcast would
        go to the orphaned one (both block until NCCL's timeout)."""
        self._check_enabled()
        info = body["init_info"]
        where = f"{info.get('master_address')}:{info.get('master_port')}"
        with self.service.lock:  # checked and joined under it: two inits at once join one
            if self.group is not None:
                raise ValueError(
                    f"this rollout server already joined the weight-transfer group of "
                    f"{self.group}; refusing a second sender ({where}): one NCCL sender per "
                    f"server, or {ROUTE}/shutdown first"
                )
            self.llm.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": info})
            self.group = where
        return {"ok": True}

    def start(self, body: dict) -> dict:
        """Checks first (the plan, the metadata against this model): a refusal changes nothing.
        Then pause and vLLM's start_weight_update."""
        self._check_enabled()
        check_sync_plan(tuple(body.get("plan", ())))
        check_metadata(meta_of_update(body["update_info"]), self.manifest(), "start")
        if self.steps:
            raise ValueError(f"a weight transfer is already in progress (steps {self.steps})")
        self.service._step_pause(body)
        self.steps, self.t0 = ["pause"], time.perf_counter()
        self._guarded(lambda: self.llm.collective_rpc("start_weight_update"))
        return {"steps": self.steps}

    def update(self, body: dict) -> dict:
        if self.steps != ["pause"]:
            raise ValueError("update_weights before start_weight_update: the server is not paused")
        info = body["update_info"]
        self._guarded(lambda: check_metadata(meta_of_update(info), self.manifest(), "update"))
        self._guarded(
            lambda: self.llm.collective_rpc("update_weights", kwargs={"update_info": info})
        )
        return {"steps": self.steps}

    def finish(self, body: dict) -> dict:
        if self.steps != ["pause"]:
            raise ValueError("finish_weight_update before start_weight_update")
        s = self.service
        self._guarded(lambda: self.llm.collective_rpc("finish_weight_update"))
        self.steps.append("load")
        for step in SYNC_PLAN[2:]:  # the three resets, the version, resume
            self._guarded(lambda step=step: getattr(s, f"_step_{step}")(body))
            self.steps.append(step)
        steps, self.steps = self.steps, []
        s.syncs.append(time.perf_counter() - self.t0)
        return {"version": s.version, "steps": steps}

    def shutdown(self, body: dict) -> dict:
        self._check_enabled()
        with self.service.lock:
            self.llm.collective_rpc("shutdown_weight_transfer_engine")
        self.group = None
        return {"ok": True}

    def _check_enabled(self) -> None:
        mode = self.service.engine.cfg.weight_transfer
        if mode != "nccl":
            raise ValueError(
                f"this rollout server was started with --weight-transfer {mode}; the NCCL "
                "routes need `paravt serve-rollout --weight-transfer nccl` (on GPUs)"
            )

    def _guarded(self, fn) -> None:
        """Run a step of a paused sync. On failure the weights are in an unknown state (vLLM
        may have begun its layerwise reload): the server is marked failed (its /health says
        so, it generates no more) and the lock released so nothing waits on it."""
        try:
            fn()
        except BaseException as err:
            self.steps = []
            self.service.failure = f"weight transfer failed: {type(err).__name__}: {err}"
            if self.service.lock.locked():
                self.service.lock.release()
            raise


def receiver_routes(service) -> dict[str, Any]:
    """The server hook: its `/weight_transfer/*` POST routes."""
    return NcclReceiver(service).routes()
