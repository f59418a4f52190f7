"""RolloutDataModule: the DataModule that generates each step's grouped rollouts.

It owns the rollout engine (`paravt.rollout.build_engine`, configured by `rollout/engine`), the
agent loop, the video reader, the frame-budget draw and the rollout seeds. Each `PromptBatch`
becomes a `RolloutBatch` (B x G trajectories, budgets, the engine's weight version) in
`on_after_batch_transfer`, which Lightning runs for the current step after the previous step's
optimiser update; with a sized loader nothing generated is prefetched. Staleness contract:
rollouts of step t use the weights after update t-1, unless `rollout.max_staleness` lets the
engine lag by that many updates (then its weights move only on `sync_weights`).

What it needs from the LightningModule is the `RolloutPolicy` Protocol (policy, processor,
policy_version, model_path), checked when it connects. Glue: it composes agent/, rollout/, video/
and data/, and holds no arithmetic.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from paravt.agent.greedy import greedy_rollouts
from paravt.agent.loop import AgentLoop
from paravt.agent.render import ChatRenderer
from paravt.agent.tools import CropCache
from paravt.data.datasets import BadRowError
from paravt.data.packing import model_rope_index
from paravt.data.prompt_datamodule import PromptBatch, PromptDataModule
from paravt.errors import VideoError
from paravt.models.lora import BaseView
from paravt.models.vision_cache import install_feature_cache, model_caches
from paravt.models.vision_cache import take_stats as take_feature_stats
from paravt.modules.rollout_config import RolloutConfig, VisionCacheConfig  # noqa: F401 (re-exported)
from paravt.parallel.distributed import is_sharded, on_meta
from paravt.rollout.consistency import VisionSpec, apply_policy, check_trajectory
from paravt.rollout.engine import RolloutEngine, SamplingParams, derive_seed
from paravt.rollout.factory import build_engine
from paravt.rollout.records import RolloutBatch
from paravt.rollout.sync.staleness import oldest_version, version_metrics
from paravt.rollout.sync.weight_sync import WeightSync
from paravt.types import AgentRun, Sample, Trajectory
from paravt.video.reader import VideoReader

log = logging.getLogger(__name__)
BudgetSampler = Callable[[str, int], int]  # (prompt id, epoch) -> frame budget K
GENERATOR_MODES = ("async", "stream")  # rollout modes with a generator process


@runtime_checkable
class RolloutPolicy(Protocol):
    """What the DataModule reads from the LightningModule to generate with its weights."""

    policy: Any  # the transformers policy module
    processor: Any
    policy_version: int  # optimiser updates applied so far
    model_path: str | None  # HF directory holding the initial weights (vLLM loads from it)


class RolloutDataModule(PromptDataModule):
    """`PromptDataModule` + generation: serves `RolloutBatch`es to the training step."""

    def __init__(self, *args, rollout: RolloutConfig | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.rollout = rollout or RolloutConfig()
        self.weight_sync = WeightSync(self.rollout.max_staleness)  # when the engine gets weights
        self.budget_sampler: BudgetSampler | None = None
        self.engine: RolloutEngine | None = None
        self.agent: AgentLoop | None = None
        self.bad_videos: dict[str, str] = {}  # video path -> error, found undecodable mid-run
        self.skipped_prompts = 0  # training prompts skipped for their video, over the run
        self.eval_video_errors: dict[str, str] = {}  # held-out video path -> error
        self.async_rollouts = None  # rollout.mode=async|stream: the generator, once started
        self._steps = None  # the loader's prompt batches, for submitting steps ahead
        self._consistency = None  # (VisionSpec, rope index) once the policy is connected
        self.crop_cache: CropCache | None = None  # built with the agent
        self._vision_models: list = []  # models whose vision tower the feature cache fronts

    # ---- the Protocol callbacks use (FrameBudgetGating) ---------------------------------------
    def set_budget_sampler(self, sampler: BudgetSampler) -> None:
        """Draw every prompt's overview frame budget with `sampler(prompt_id, epoch)`."""
        self.budget_sampler = sampler

    # ---- wiring -----------------------------------------------------------------------------
    def connect(self, module: RolloutPolicy) -> AgentLoop:
        """Build the engine and the agent loop on `module`'s policy (once).

        Lightning runs `setup` before `configure_model`, so under FSDP2 the policy is a
        meta-device skeleton at the first connect and sharded (and filled) after it: the engine
        then shares the skeleton, whatever `rollout.max_staleness` asks (a copy would copy no
        weights), and is replaced by the rank's own unsharded copy once the policy is sharded
        (`build_engine` makes one for a sharded policy)."""
        if self.agent is not None:
            if self.engine_shares(module) and is_sharded(module.policy):
                self.engine = self._build_engine(module)
                self.agent.engine = self.engine
            return self.agent
        if not isinstance(module, RolloutPolicy):
            raise TypeError(
                f"RolloutDataModule generates with the LightningModule's weights, but "
                f"{type(module).__name__} lacks policy / processor / policy_version / model_path"
            )
        self.engine = self._build_engine(module)
        renderer = ChatRenderer(module.processor)
        cache = self.rollout.vision_cache
        self.crop_cache = CropCache(cache.crop_bytes if cache.enabled else 0)
        if self.rollout.agent_program:  # the user's agent program, through the gateway
            from paravt.gateway.rollouts import build_rollouts

            self.agent = build_rollouts(self.rollout, self.engine, module.processor)
            return self.agent
        self.agent = AgentLoop(
            self.engine,
            renderer,
            VideoReader(),
            self.rollout.agent,
            self.rollout.crop,
            crop_cache=self.crop_cache,
            tools=self.rollout.toolbox,
        )
        log.info("agent tools: %s", ", ".join(self.agent.executor.names))
        return self.agent

    def _build_engine(self, module: RolloutPolicy) -> RolloutEngine:
        engine = build_engine(
            self.rollout.engine,
            module.policy,
            module.processor,
            model_path=module.model_path,
            share_weights=self.rollout.max_staleness == 0 or on_meta(module.policy),
        )
        if self.rollout.mode in GENERATOR_MODES and hasattr(engine, "leave_nccl_to_generator"):
            engine.leave_nccl_to_generator()  # one NCCL sender per server: the generator's
        self._vision_models = self.install_feature_caches(module, getattr(engine, "model", None))
        return engine

    def install_feature_caches(self, module: RolloutPolicy, engine_model) -> list:
        """The vision feature cache (`rollout.vision_cache`) on the policy, the reference and an
        engine's own copy: the models whose forwards encode the step's clips. Off, the models
        are still wrapped, to time their vision tower (`time/*_vision`), and cache nothing."""
        cfg = self.rollout.vision_cache
        models = [module.policy, getattr(module, "reference", None), engine_model]
        models = [m for m in models if isinstance(m, torch.nn.Module | BaseView)]
        installed = []
        for model in models:
            try:
                install_feature_cache(model, cfg.feature_bytes, cfg.enabled)
            except AttributeError as err:  # not a Qwen-VL model: its tower runs uncached
                log.warning("rollout.vision_cache: %s", err)
                continue
            installed.append(model)
        return installed

    def engine_shares(self, module: RolloutPolicy) -> bool:
        """Whether the engine generates with `module`'s policy object itself."""
        return getattr(self.engine, "model", None) is module.policy

    def setup(self, stage: str | None = None) -> None:
        super().setup(stage)
        if self.trainer is not None and self.trainer.lightning_module is not None:
            self.connect(self.trainer.lightning_module)

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        return batch  # prompts hold no tensors; rollouts are built on the policy's device

    def train_dataloader(self):
        loader = super().train_dataloader()
        self._steps = loader.dataset
        return loader

    def prompt_batch(self, step: int, past_end: bool = False) -> PromptBatch | None:
        """The whole prompt batch of `step`, every rank's share (None past the last step,
        unless `past_end`: streaming replaces dropped groups from the prompts that follow),
        ahead of the loader: what rank 0's asynchronous generator samples."""
        i = step - self._steps.start
        return self._steps.whole(i) if i >= 0 and (past_end or i < len(self._steps)) else None

    def sampling(self, step: int) -> SamplingParams:
        """The sampling of `step`'s rollouts: its seed depends on the run's seed and the step
        alone; the agent loop derives each request's from it (`AgentLoop.start`)."""
        return SamplingParams(
            temperature=self.rollout.temperature, seed=derive_seed(self.seed, step)
        )

    def teardown(self, stage: str | None = None) -> None:
        self.stop_async()
        super().teardown(stage)

    def on_exception(self, exception: BaseException) -> None:
        self.stop_async()

    def stop_async(self) -> None:
        """Stop the generator process of rollout.mode=async or stream (if any)."""
        if self.async_rollouts is not None:
            self.async_rollouts.close()
            self.async_rollouts = None

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        if isinstance(batch, PromptBatch):
            return self.generate_rollouts(batch, self.trainer.lightning_module)
        return batch

    # ---- generation -------------------------------------------------------------------------
    def sync(self, module: RolloutPolicy, max_staleness: int) -> float:
        """Give the engine `module`'s weights when they lag by more than `max_staleness`
        (`WeightSync.at_batch`); the seconds it took (time/sync)."""
        return self.weight_sync.at_batch(
            self.engine, module.policy, module.policy_version, max_staleness
        )

    def end_step(self) -> None:
        """The step's last agent round is done: an engine with a sleep mode may sleep now,
        discarding its weights when the next generation reloads them anyway (no staleness)."""
        end = getattr(self.engine, "end_step", None)
        if callable(end):
            end(reload_follows=self.rollout.max_staleness == 0)

    def budgets(self, samples: Sequence[Sample], epoch: int) -> list[int]:
        if self.budget_sampler is None:
            return [self.rollout.frame_budget] * len(samples)
        return [int(self.budget_sampler(s.id, epoch)) for s in samples]

    def generate_rollouts(self, batch: PromptBatch, module: RolloutPolicy) -> RolloutBatch:
        """The B x G trajectories of `batch`, sampled with the weights the contract allows.

        A prompt whose video fails to decode is dropped from the batch with its group (logged
        once per video, counted, never retried); `fail_fast` stops the run instead.
        """
        agent = self.connect(module)
        decoded = self._start_step_caches(agent)  # async too: the trainer's passes fill it
        if self.rollout.mode in GENERATOR_MODES:
            from paravt.generator.async_rollouts import AsyncRollouts, rollout_batch
            from paravt.generator.stream_rollouts import StreamRollouts

            if self.async_rollouts is None:
                kind = StreamRollouts if self.rollout.mode == "stream" else AsyncRollouts
                self.async_rollouts = kind(self, module)
            got = self.async_rollouts.take(batch.step, module)
            if got is not None:
                return rollout_batch(self, batch, module, got)
            self.sync(module, 0)  # too stale: regenerated here with the current weights
        sync_s = self.sync(module, self.rollout.max_staleness)
        kept = batch.kept(self.bad_videos)
        samples, positions = [s for _, s in kept], [p for p, _ in kept]
        skipped = [
            (s.id, self.bad_videos[s.video]) for s in batch.samples if s.video in self.bad_videos
        ]
        budgets = self.budgets(samples, batch.epoch)
        version = self.engine.weight_version
        params = self.sampling(batch.step)
        t0 = time.perf_counter()
        result = self._settled(lambda: self._run(agent, samples, budgets, params, positions))
        trajs = list(result)
        self.end_step()
        if result.video_errors:
            samples, budgets, trajs = self._drop_bad(
                batch.step, samples, budgets, trajs, skipped, result.video_errors
            )
        self.skipped_prompts += len(skipped)
        timings = {"sync": sync_s, "rollout": time.perf_counter() - t0}
        timings |= {f"rollout_{k}": v for k, v in result.timings.items()}
        cache_timings, cache_counts = self._rollout_cache_metrics(agent, decoded)
        timings |= cache_timings
        counts = self.skip_counts() | cache_counts
        return self.build_batch(
            batch, module, samples, budgets, trajs, skipped, version, timings, counts
        )

    def build_batch(
        self,
        batch: PromptBatch,
        module: RolloutPolicy,
        samples: Sequence[Sample],
        budgets: Sequence[int],
        trajs: Sequence[Trajectory],
        skipped: Sequence[tuple[str, str]],
        version: int,
        timings: dict[str, float],
        counts: dict[str, float],
    ) -> RolloutBatch:
        """The step's `RolloutBatch` (both modes): the consistency check applied, the staleness
        taken from the oldest token (`version` when the trajectories record none) and the
        tokens' policy versions summarised (`paravt.rollout.sync.staleness.version_metrics`)."""
        cfg = self.rollout
        t0 = time.perf_counter()
        trajs, checked = self.check_consistency(batch.step, trajs, module)
        timings = timings | {"consistency": time.perf_counter() - t0}
        version = oldest_version(trajs, default=version)
        counts = counts | checked | version_metrics(trajs, module.policy_version)
        self.consumed = batch.step + 1
        return RolloutBatch(
            step=batch.step,
            epoch=batch.epoch,
            samples=tuple(samples),
            budgets=tuple(budgets),
            trajectories=tuple(trajs),
            group_size=cfg.group_size,
            temperature=cfg.temperature,
            weight_version=version,
            staleness=module.policy_version - version,
            durations=tuple(self.agent.source.info(s.video).duration for s in samples),
            timings=timings,
            skipped=tuple(skipped),
            counts=counts,
        )

    def _start_step_caches(self, agent: AgentLoop) -> float:
        """A new step: the previous step's vision features are dropped (they hold device
        memory) and the cache counters restart; the reader's decode seconds so far."""
        for cache in model_caches(*self._vision_models):
            cache.clear()
        take_feature_stats(*self._vision_models)
        return float(getattr(agent.source, "read_seconds", 0.0))

    def _rollout_cache_metrics(
        self, agent: AgentLoop, decoded: float
    ) -> tuple[dict[str, float], dict[str, float]]:
        """The rollout's seconds decoding video and in the vision tower, and the step's crop
        and feature cache counts (`GRPOModule` adds the trainer passes' feature hits)."""
        hits, misses, seconds = take_feature_stats(*self._vision_models)
        decode = float(getattr(agent.source, "read_seconds", 0.0)) - decoded
        crop_hits, crop_lookups = self.crop_cache.take_stats() if self.crop_cache else (0, 0)
        timings = {"rollout_decode": decode, "rollout_vision": seconds}
        counts = {
            "vision_cache/crop_hits": float(crop_hits),
            "vision_cache/crop_lookups": float(crop_lookups),
            "vision_cache/rollout_feature_hits": float(hits),
            "vision_cache/rollout_feature_clips": float(hits + misses),
        }
        return timings, counts

    def check_consistency(self, step: int, trajs, module: RolloutPolicy) -> tuple[list, dict]:
        """`rollout.consistency` applied to the step's trajectories: tokens vs vision inputs,
        time labels, M-RoPE positions (paravt.rollout.consistency); error raises, warn drops."""
        mode = self.rollout.consistency
        if mode == "off":
            return list(trajs), {}
        if self._consistency is None:
            spec = VisionSpec.from_processor(module.processor)
            self._consistency = (spec, model_rope_index(module.policy))
        spec, rope = self._consistency
        decode = module.processor.tokenizer.decode
        found = [check_trajectory(t, spec, rope, decode) for t in trajs]
        return apply_policy(trajs, found, mode, step)

    def _run(self, agent: AgentLoop, samples, budgets, params, positions) -> AgentRun:
        try:
            return agent.run(
                samples,
                budgets,
                self.rollout.group_size,
                params,
                skip_bad_videos=not self.fail_fast,
                positions=positions,
            )
        except VideoError as error:  # only with fail_fast
            raise BadRowError(
                f"{error} (data.fail_fast=true stops here; set it to false to skip such prompts)"
            ) from error

    def _settled(self, run: Callable[[], AgentRun]) -> AgentRun:
        """`run()`; then every rank learns whether any rank's rollouts failed and all raise
        together: a rank that went on would wait in the training step's collectives until
        NCCL's timeout. Rollout servers' `settle` also pools what the servers said of their
        versions; every other engine (each rank's own, e.g. in-process vLLM) `settle_ranks`."""
        from paravt.parallel.collectives import settle_ranks

        settle = getattr(self.engine, "settle", None) or settle_ranks
        try:
            out = run()
        except Exception as error:
            settle(error)
            raise
        settle(None)
        return out

    def _drop_bad(self, step: int, samples, budgets, trajs, skipped: list, errors) -> tuple:
        """Remove the groups whose video failed; remember the videos and log each one once."""
        g = self.rollout.group_size
        for s in samples:
            if s.id in errors:
                self.bad_videos[s.video] = errors[s.id]
                skipped.append((s.id, errors[s.id]))
                log.warning(
                    "step %d: skipped prompt %r, its video failed to decode: %s; the prompt is "
                    "left out from now on (%d undecodable video(s) so far; data.fail_fast=true "
                    "stops instead)",
                    step,
                    s.id,
                    errors[s.id],
                    len(self.bad_videos),
                )
        keep = [b for b, s in enumerate(samples) if s.id not in errors]
        kept_trajs = [t for b in keep for t in trajs[b * g : (b + 1) * g]]
        return [samples[b] for b in keep], [budgets[b] for b in keep], kept_trajs

    def skip_counts(self) -> dict[str, float]:
        """What was left out so far: bad rows and videos at load, undecodable videos mid-run."""
        report = self.load_report
        load_videos = report.video_errors if report is not None else 0
        load_rows = len(report.skipped) - load_videos if report is not None else 0
        return {
            "data/bad_rows": float(load_rows),
            "data/bad_videos_at_load": float(load_videos),
            "data/undecodable_videos": float(len(self.bad_videos)),
            "data/skipped_prompts": float(self.skipped_prompts),
            "data/undecodable_eval_videos": float(len(self.eval_video_errors)),
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "bad_videos": dict(self.bad_videos),
            "skipped_prompts": self.skipped_prompts,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.bad_videos = dict(state_dict.get("bad_videos", {}))
        self.skipped_prompts = int(state_dict.get("skipped_prompts", 0))

    def evaluate(
        self, module: RolloutPolicy, samples: Sequence[Sample], greedy: bool = True
    ) -> list[Trajectory]:
        """One trajectory per sample with the module's current weights (held-out evaluation,
        `paravt.agent.greedy.greedy_rollouts`: the engine is synced first)."""
        agent = self.connect(module)
        budgets = [self.rollout.frame_budget] * len(samples)
        params = SamplingParams(greedy=greedy, temperature=self.rollout.temperature)
        run = self._settled(
            lambda: greedy_rollouts(
                agent,
                samples,
                budgets,
                module.policy,
                module.policy_version,
                params,
                skip_bad_videos=not self.fail_fast,
            )
        )
        errors = run.video_errors
        self.end_step()
        for s in samples:  # an undecodable held-out video is scored as no answer, and counted
            if s.id in errors and s.video not in self.eval_video_errors:
                self.eval_video_errors[s.video] = errors[s.id]
                log.warning("held-out sample %r scored wrong: %s", s.id, errors[s.id])
        return list(run)
