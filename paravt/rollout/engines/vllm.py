"""`VLLMEngine`: the `RolloutEngine` on an in-process `vllm.LLM` (CPU backend here, CUDA on GPUs).

Requests. A trajectory's context holds every clip already expanded into its vision tokens (what
the trainer sees); vLLM wants one placeholder per clip plus the frames, and expands it itself
(already-expanded ids would be expanded again). So each request is collapsed: every clip's
expansion is replaced by the chat template's video placeholder, and the clip's decoded frames go
into `multi_modal_data` with fps, duration and source frame indices (`do_sample_frames=False`).
vLLM's expanded prompt must equal the trajectory's ids token for token; a mismatch raises.

Sampling follows `paravt.rollout.engine`'s log-prob definition: the vision placeholder ids get a
-100 logit bias (vLLM's clamp; never sampled, and the reported `processed_logprobs` are then the
masked distribution's, as the trainer masks them), no top-k / top-p, temperature T (greedy: 0,
log-probs at T = 1). Each request samples with its own seed (`GenerationRequest.seed`, set by the
agent loop per trajectory and turn), so the G copies of a prompt differ.

Weights. `sync_weights` streams the policy's tensors in buckets of `sync_bucket_mb` into vLLM's
`reload_weights` (never a second full copy), then resets the prefix cache and the multimodal /
encoder caches (vision embeddings computed with the old weights must not be reused).

Sleep mode (GPU): the engine sleeps once per step, after the step's last agent round
(`end_step`), never between rounds (the prefix cache carries a trajectory's rounds); the next
sync wakes the weights, reloads them, then wakes the KV cache, the allocator's cache emptied
before each wake. When a full reload follows (`end_step(reload_follows=True)`: no staleness
allowed) it sleeps at level 2 and discards the weights instead of copying them to the host and
back; it then generates nothing before the next `sync_weights` (`needs_sync`). Under a
multi-GPU launch see `paravt.rollout.engines.vllm_launch`.

One open engine per process. vLLM keeps its parallel state (the world, tensor- and
pipeline-parallel groups) in module globals shared by every in-process `vllm.LLM`, and an
engine's shutdown tears them down for all (and destroys torch.distributed's default group, the
one Lightning's ranks share under the external launcher). Two engines can run side by side, but
once either is closed or garbage-collected the other fails deep inside vLLM ("pipeline model
parallel group is not initialized"). So `from_model` first collects the engines nobody holds
any more (their teardown happens then, not in the middle of the new engine's life) and warns
when one is still open; `generate` and `sync_weights` raise an error naming the cause when the
state is gone; `close()` shuts an engine down at a chosen moment and `close_engines()` closes
them all: a sweep's job ends with it (`paravt.parallel.launch.end_job`, after the job's process
group is gone), so the next job starts its engine on a clean state.
"""

from __future__ import annotations

import gc
import logging
import os
import tempfile
import time
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

from paravt.models.qwen_vl import chat_text, clip_metadata, vision_placeholder_ids
from paravt.parallel.placement import gpu_placement, has_cuda
from paravt.rollout.engine import (
    EngineConfig,
    GenerationOutput,
    GenerationRequest,
    SamplingParams,
    request_seeds,
)
from paravt.rollout.engines.vllm_launch import (
    export_launch_env,
    gpu_launch_kwargs,
    keep_engine_in_process,
    launch_world,
)

# vLLM's CPU backend on a small shared machine: no core binding, in-process engine core, and a
# small oneDNN primitive cache. vLLM's CPU linear layers are oneDNN matmuls, compiled per shape
# and kept in oneDNN's global cache, 1,024 of them by default: with rollouts of ever new token
# counts host memory grew ~0.64 MiB a training step in the demo; capped at 64 it is flat, at no
# measurable cost in speed (docs/performance.md, "Host memory"). oneDNN reads the variable when vLLM
# first builds a primitive, so setting it before the engine starts is enough.
CPU_ENV = {
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64",
}

log = logging.getLogger(__name__)
_OPEN: weakref.WeakSet[VLLMEngine] = weakref.WeakSet()  # engines that own a running vllm.LLM


def _parallel_state_ready() -> bool:
    """Whether vLLM's process-wide tensor- and pipeline-parallel groups exist."""
    from vllm.distributed.parallel_state import model_parallel_is_initialized

    return model_parallel_is_initialized()


def close_engines() -> int:
    """Close every open in-process engine of this process (see the module docstring); how many
    were open. Call it once no rank needs the torch.distributed group any more."""
    engines = list(_OPEN)
    for engine in engines:
        engine.close()
    return len(engines)


def _empty_cuda_cache() -> None:
    import torch

    torch.cuda.empty_cache()  # nothing to do (and no error) without CUDA


def placement_kwargs(cfg: EngineConfig, world: int | None = None) -> dict[str, Any]:
    """The GPU placement and launch arguments (`paravt.parallel.placement.gpu_placement`: a GPU,
    or PARAVT_ASSUME_GPU=1); none elsewhere. `world`: the launch this engine belongs to (None:
    `launch_world`'s; 1 for a standalone engine such as a rollout server's)."""
    from paravt.rollout.serving.nccl import check_cuda

    on_gpu = gpu_placement()
    check_cuda(cfg.weight_transfer, on_gpu)  # nccl: a rollout server on a GPU only
    if not on_gpu:
        return {}
    kwargs: dict[str, Any] = {
        "gpu_memory_utilization": cfg.gpu_memory_utilization,
        "tensor_parallel_size": cfg.tensor_parallel_size,
        "enable_sleep_mode": cfg.enable_sleep_mode,
    }
    if cfg.weight_transfer == "nccl":  # the trainer's rank 0 sends (paravt.rollout.serving.nccl)
        kwargs["weight_transfer_config"] = {"backend": "nccl"}
    # Under a W-rank launch: external_launcher, each rank's engine on its own GPU.
    world = launch_world()[1] if world is None else world
    return kwargs | gpu_launch_kwargs(cfg.tensor_parallel_size, world)


def backend_kwargs(cfg: EngineConfig) -> dict[str, Any]:
    """The CPU backend's own arguments, where there is no CUDA device (forced or not)."""
    if has_cuda():
        return {}
    return {
        "enforce_eager": True,
        # No chunked prefill on the CPU backend: a prompt split over engine steps has its
        # partial step's token discarded, and vLLM then rewinds the request's seeded generator
        # with `set_offset`, which a CPU generator lacks ("CPU Generator does not use offset":
        # the engine dies mid-rollout, seen with a group of long multi-crop contexts). vLLM does
        # the same for MLA models on CPU; every prompt then fits one step.
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": max(cfg.max_model_len, 8192),
    }


def llm_kwargs(
    cfg: EngineConfig, path: str, max_videos: int, world: int | None = None
) -> dict[str, Any]:
    """`vllm.LLM` arguments: the common ones, the placement ones (`placement_kwargs`) and the
    CPU backend's (`backend_kwargs`)."""
    kwargs: dict[str, Any] = {
        "model": path,
        "dtype": cfg.dtype,
        "max_model_len": cfg.max_model_len,
        "max_num_seqs": cfg.max_num_seqs,
        "seed": cfg.seed,
        "enable_prefix_caching": cfg.enable_prefix_caching,
        "mm_processor_cache_gb": cfg.mm_processor_cache_gb,
        "logprobs_mode": "processed_logprobs",
        "limit_mm_per_prompt": {"video": max_videos, "image": 0},
        # Normalise in the processor (as the trainer's pixels are), not with the image
        # processor's mean/std on the device, which differ from the video's for some checkpoints.
        "mm_device_do_normalize": False,
    }
    return kwargs | placement_kwargs(cfg, world) | backend_kwargs(cfg)


def video_placeholder(processor) -> tuple[str, tuple[int, ...]]:
    """What the chat template writes for one video (text, ids), before the processor expands it."""
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "\x01"},
                {"type": "video"},
                {"type": "text", "text": "\x02"},
            ],
        }
    ]
    text = chat_text(processor, messages, generation_prompt=False)
    inner = text[text.index("\x01") + 1 : text.index("\x02")]
    return inner, tuple(processor.tokenizer(inner, add_special_tokens=False)["input_ids"])


def _find(seq: Sequence[int], sub: Sequence[int], start: int) -> int:
    n, first = len(sub), sub[0]
    for i in range(start, len(seq) - n + 1):
        if seq[i] == first and tuple(seq[i : i + n]) == tuple(sub):
            return i
    return -1


class _FirstTimeOnly(logging.Filter):
    """Lets each of vLLM's per-call notices through once, not at every step.

    On CPU, vLLM replaces `torch.set_num_threads` with a warning (34 a step in the demo); every
    in-place reload warns that the rotary embeddings have no weights to load (they have none:
    their tables are computed, and the post-sync log-prob parity test shows they are right) and
    logs its timing and the prefix-cache reset. `time/sync` carries the timing.
    """

    NOTICES = (
        "doesn't allow to use `torch.set_num_threads`",
        "RotaryEmbedding: Failed to load weights",
        "Reloading and processing weights took",
        "Successfully reset prefix cache",
    )

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        notice = next((n for n in self.NOTICES if n in message), None)
        if notice is None:
            return True
        if notice in self.seen:
            return False
        self.seen.add(notice)
        record.msg, record.args = f"{message} (shown once; repeats are silenced)", None
        return True


def _collect_unheld_engines() -> None:
    """Shut down the engines nobody holds any more now, and warn when one is still open (the
    module docstring says why)."""
    if _OPEN:
        gc.collect()
    if _OPEN:
        log.warning(
            "another vLLM engine is open in this process (%d): vLLM's parallel state is "
            "process-wide, so once either engine is closed the other fails. Close the old one "
            "first (VLLMEngine.close(), paravt.rollout.engines.vllm.close_engines()), or run the "
            "second model as a rollout server (`paravt serve-rollout`, docs/engines.md)",
            len(_OPEN),
        )


def _silence_repeats() -> None:
    """Install `_FirstTimeOnly` on the handlers of vLLM's logger and the root (once each)."""
    for handler in [*logging.getLogger("vllm").handlers, *logging.getLogger().handlers]:
        if not any(isinstance(f, _FirstTimeOnly) for f in handler.filters):
            handler.addFilter(_FirstTimeOnly())


class VLLMEngine:
    """`RolloutEngine` over `vllm.LLM`; see the module docstring for the request contract."""

    def __init__(self, llm, processor, cfg: EngineConfig):
        self.llm, self.processor, self.cfg = llm, processor, cfg
        tok = processor.tokenizer
        self.suppress_ids = vision_placeholder_ids(tok)
        self.stop_ids = [tok.convert_tokens_to_ids("<|im_end|>")]
        self.placeholder_text, self.placeholder_ids = video_placeholder(processor)
        self._expansions: dict[tuple, tuple[int, ...]] = {}
        self._version = 0
        self._asleep: set[str] = set()  # sleep-mode parts released: "weights", "kv_cache"
        self._discarded = False  # slept at level 2: no weights until the next sync_weights
        self.empty_cache = _empty_cuda_cache  # frees the allocator's cached blocks before waking
        self.last_sync_s = 0.0
        self.closed = False

    @classmethod
    def from_model(
        cls,
        cfg: EngineConfig,
        model,
        processor,
        model_path: str | None = None,
        world: int | None = None,
    ):
        """Start vLLM on `model_path`, or on a temporary export of `model` when there is none;
        `world`: as in `placement_kwargs` (1: a standalone engine, never the external launcher)."""
        if not has_cuda():
            for key, value in CPU_ENV.items():
                os.environ.setdefault(key, value)
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.kv_cache_gb))
        keep_engine_in_process()  # the in-place reload cannot cross into a child process
        try:
            import vllm
        except ImportError as err:
            raise ImportError(
                "rollout/engine=vllm needs vLLM: on a GPU `pip install -e '.[vllm]'`; on a CPU "
                "`make venv-vllm` and run with .venv-vllm/bin/python (docs/engines.md)"
            ) from err
        _collect_unheld_engines()
        path = model_path
        if path is None:
            from paravt.models.lora import is_lora, merged_state_dict

            path = tempfile.mkdtemp(prefix="paravt_vllm_")
            merged = merged_state_dict(model) if is_lora(model) else None  # LoRA: base names
            model.save_pretrained(path, state_dict=merged)
            processor.save_pretrained(path)
        kwargs = llm_kwargs(cfg, str(path), cfg.max_videos_per_prompt, world)
        if kwargs.get("distributed_executor_backend") == "external_launcher":
            export_launch_env()  # RANK / LOCAL_RANK, which Lightning's launcher and srun omit
        llm = vllm.LLM(**kwargs)
        _silence_repeats()  # vLLM installs its log handler while the engine starts
        engine = cls(llm, processor, cfg)
        _OPEN.add(engine)
        return engine

    def close(self) -> None:
        """Shut the engine down now: its memory, and vLLM's process-wide parallel state (with
        torch.distributed's default group under the external launcher, so close after the
        ranks' last collective). Idempotent; generating afterwards raises."""
        if self.closed:
            return
        self.closed = True
        _OPEN.discard(self)
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if callable(getattr(core, "shutdown", None)):
            core.shutdown()

    # ---- RolloutEngine ----------------------------------------------------------------------
    @property
    def weight_version(self) -> int:
        return self._version

    def generate(
        self,
        requests: Sequence[GenerationRequest],
        params: SamplingParams,
    ) -> list[list[GenerationOutput]]:
        """Each request sampled with its own seed (`request_seeds`), so its tokens do not depend
        on which call, batch or server it was sent in."""
        self._check_open()
        if not requests:
            return []
        if self._discarded:
            raise RuntimeError(
                "the vLLM engine discarded its weights in its last sleep (level 2): call "
                "sync_weights before generate"
            )
        self._wake()
        prompts = [self._prompt(i, r) for i, r in enumerate(requests)]
        sampling = [self._sampling(params, seed) for seed in request_seeds(requests, params)]
        outs = self.llm.generate(prompts, sampling, use_tqdm=False)
        results = []
        for i, (req, out) in enumerate(zip(requests, outs, strict=True)):
            self._check_expansion(i, req, out.prompt_token_ids)
            results.append([self._output(c) for c in out.outputs])
        return results

    def sync_weights(self, policy, version: int) -> None:
        """Stream `policy`'s weights into vLLM in place; reset every cache that holds old ones."""
        self._check_open()
        t0 = time.perf_counter()
        self._wake(("weights",))  # weights first; the KV cache only once they are in place
        self.llm.collective_rpc(
            "reload_weights",
            kwargs={"weights_iterator": self._buckets(policy), "is_checkpoint_format": True},
        )
        self._wake(("kv_cache",))
        self._discarded = False
        self._reset_caches()
        self._expansions.clear()
        self._version = version
        self.last_sync_s = time.perf_counter() - t0

    @property
    def needs_sync(self) -> bool:
        """Whether the weights were discarded (level-2 sleep) and must be reloaded."""
        return self._discarded

    def end_step(self, reload_follows: bool = False) -> None:
        """After a step's last agent round: sleep (sleep mode on a GPU), releasing the KV cache
        and the weights for the update. Once per step, not per round, so the prefix cache
        lives across a trajectory's rounds. `reload_follows`: the next wake reloads every
        weight, so level 2 discards them; otherwise level 1 keeps a host copy (a
        stale-allowed engine is not synced on every wake)."""
        if self.cfg.enable_sleep_mode and gpu_placement() and not self._asleep:
            self.llm.sleep(level=2 if reload_follows else 1)
            self._asleep = {"weights", "kv_cache"}
            self._discarded = reload_follows

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("this vLLM engine was closed (VLLMEngine.close); build a new one")
        if self in _OPEN and not _parallel_state_ready():
            raise RuntimeError(
                "vLLM's process-wide parallel state was torn down under this engine: another "
                "in-process vLLM engine of this process was closed or garbage-collected, or "
                "torch.distributed's group was destroyed. One open engine per process: close "
                "the old one before building the next (docs/engines.md)"
            )

    # ---- requests ---------------------------------------------------------------------------
    def _prompt(self, i: int, req: GenerationRequest) -> dict[str, Any]:
        name = req.name or f"request {i}"
        if len(req.token_ids) >= self.cfg.max_model_len:
            raise ValueError(
                f"{name}: context of {len(req.token_ids)} tokens does not fit the vLLM engine's "
                f"max_model_len={self.cfg.max_model_len}; raise rollout.engine.max_model_len or "
                "lower rollout.agent.max_total_tokens"
            )
        ids, videos, cursor = [], [], 0
        for k, visual in enumerate(req.visuals):
            frames = visual.frames
            if frames is None or len(frames.indices) < 2:
                n = 0 if frames is None else len(frames.indices)
                raise ValueError(
                    f"{name}: clip {k} has {n} decoded frame(s); the vLLM engine needs each "
                    "clip's frames (>= 2, one temporal patch) to re-expand it: check the crop's "
                    "min_frames and the renderer"
                )
            expansion = self._expansion(visual)
            at = _find(req.token_ids, expansion, cursor)
            if at < 0:
                raise ValueError(
                    f"{name}: clip {k}'s vision tokens were not found in the context after "
                    f"position {cursor}; the request's visuals do not match its token ids"
                )
            ids += [*req.token_ids[cursor:at], *self.placeholder_ids]
            cursor = at + len(expansion)
            videos.append((frames.pixels, self._metadata(frames)))
        ids += req.token_ids[cursor:]
        prompt: dict[str, Any] = {"prompt_token_ids": ids}
        if videos:
            prompt["multi_modal_data"] = {"video": videos}
            prompt["mm_processor_kwargs"] = {"do_sample_frames": False}
        return prompt

    def _expansion(self, visual) -> tuple[int, ...]:
        """The ids the processor expands this clip's placeholder into, cached by what they depend
        on (frame array shape, frame indices, fps, duration), never holding the clip's pixels."""
        frames = visual.frames
        key = (tuple(frames.pixels.shape), tuple(frames.indices), frames.fps, frames.duration)
        hit = self._expansions.get(key)
        if hit is not None:
            return hit
        out = self.processor(
            text=[self.placeholder_text],
            videos=[visual.frames.pixels],
            video_metadata=[clip_metadata(visual.frames)],
            do_sample_frames=False,
            return_tensors="pt",
        )
        ids = tuple(out["input_ids"][0].tolist())
        if len(self._expansions) > 4096:
            self._expansions.clear()
        self._expansions[key] = ids
        return ids

    @staticmethod
    def _metadata(frames) -> dict[str, Any]:
        meta = clip_metadata(frames)
        return {
            "fps": meta.fps,
            "duration": meta.duration,
            "total_num_frames": meta.total_num_frames,
            "frames_indices": list(meta.frames_indices),
            "video_backend": "paravt",
            "do_sample_frames": False,
        }

    def _sampling(self, params: SamplingParams, seed: int | None):
        import vllm

        return vllm.SamplingParams(
            n=params.n,
            temperature=0.0 if params.greedy else params.temperature,
            top_k=0 if not params.greedy else -1,
            top_p=1.0,
            max_tokens=params.max_new_tokens,
            logprobs=0,
            seed=seed,
            logit_bias={t: -100.0 for t in self.suppress_ids},
            stop_token_ids=self.stop_ids,
            skip_special_tokens=False,
        )

    def _check_expansion(self, i: int, req: GenerationRequest, got) -> None:
        if tuple(got) == tuple(req.token_ids):
            return
        diff = next(
            (j for j, (a, b) in enumerate(zip(got, req.token_ids, strict=False)) if a != b),
            min(len(got), len(req.token_ids)),
        )
        raise ValueError(
            f"{req.name or f'request {i}'}: vLLM expanded the context to {len(got)} ids, the "
            f"trajectory has {len(req.token_ids)}; first difference at position {diff}. Behaviour "
            "log-probs would not be the trainer's: check the clips' metadata and the processor"
        )

    def _output(self, c) -> GenerationOutput:
        ids = tuple(c.token_ids)
        logp = tuple(float(c.logprobs[j][t].logprob) for j, t in enumerate(ids))
        reason = "stop" if ids and ids[-1] in self.stop_ids else "length"
        return GenerationOutput(ids, logp, reason)

    # ---- weights ----------------------------------------------------------------------------
    def _buckets(self, policy) -> Iterator[tuple[str, Any]]:
        """(name, tensor) of `policy`, materialised at most `sync_bucket_mb` at a time (gathered
        from the shards of an FSDP2 policy: every rank calls this, each for its own engine)."""
        import torch

        from paravt.rollout.sync.weight_sync import iter_weights

        dtype = getattr(torch, self.cfg.dtype)
        device = next(policy.parameters()).device if gpu_placement() else "cpu"
        # LoRA: vLLM loads the base model's names, base + adapter merged (gathered if sharded)
        for bucket in iter_weights(policy, self.cfg.sync_bucket_mb << 20, device, dtype):
            yield from bucket

    def _reset_caches(self) -> None:
        """Prefix (KV) blocks, processed multimodal inputs and encoder outputs of old weights."""
        self.llm.reset_prefix_cache()
        self.llm.reset_mm_cache()
        engine = getattr(self.llm, "llm_engine", None)
        if callable(getattr(engine, "reset_encoder_cache", None)):
            engine.reset_encoder_cache()

    def _wake(self, tags: Sequence[str] = ("weights", "kv_cache")) -> None:
        """Wake the sleeping parts among `tags`, the allocator's cached blocks freed first (TRL's
        and verl's order: weights, load them, then the KV cache)."""
        todo = [t for t in tags if t in self._asleep]
        if not todo:
            return
        self.empty_cache()
        self.llm.wake_up(tags=todo)
        self._asleep -= set(todo)
