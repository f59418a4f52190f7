"""Rollouts by the user's own agent program: one episode per rollout, played through the gateway.

`GatewayRollouts.run` has `AgentLoop.run`'s signature and result: for B samples x G rollouts it
opens B * G episodes (each with paravt's task payload and the trainer's sampling parameters,
which replace whatever the agent asks for), hands each to the agent program on a long-lived
worker pool (threads, started once: an agent spends its time waiting on HTTP, and a fresh
Python process per rollout costs about a second here), and returns each episode's last
trajectory in group-major order. An agent that raises, or leaves its episode idle past the
gateway's `episode_idle_s` (it hung), gets an empty `AGENT_ERROR` trajectory (scored as no
answer) and its error in `video_errors`, so the other rollouts go on.

An agent program is `program(base_url, payload) -> float | None`: `base_url` is the episode's
OpenAI base URL (`.../episodes/<id>/v1`), `payload` the task (`paravt.gateway.task`); a number
it returns is the episode's reward unless it posted one (`POST /v1/episodes/<id>/reward`), and
rides on the rollout as `Trajectory.agent_reward` (trained on per `reward.agent_reward`).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from paravt.gateway.app import Gateway, HTTPError
from paravt.gateway.serve import serving
from paravt.gateway.task import task_payload
from paravt.rollout.engine import SamplingParams, derive_seed
from paravt.types import AgentRun, Sample, Trajectory

AgentProgram = Callable[[str, dict[str, Any]], Any]
AGENT_ERROR = "agent_error"  # finish_reason of a rollout whose agent program raised


def load_program(spec: str) -> AgentProgram:
    """`"package.module:function"` -> the function (a config names the agent this way)."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"agent program {spec!r}: write it as 'package.module:function'")
    program = getattr(importlib.import_module(module), name, None)
    if not callable(program):
        raise ValueError(f"agent program {spec!r}: {module} has no function {name}")
    return program


class GatewayRollouts:
    """The agent program's rollouts of samples through an in-process gateway (a context
    manager: the server and the worker pool live from `__enter__` to `__exit__`)."""

    def __init__(
        self,
        gateway: Gateway,
        program: AgentProgram,
        source,
        workers: int = 16,
        system: str | None = None,
        max_new_tokens: int = 2048,
        overview_max_pixels: int = 50176,
        loop=None,
    ):
        self.gateway = gateway
        # paravt's own `AgentLoop` on the same engine and settings, or None: what traces a cold
        # start's teacher (paravt.run.coldstart), whose scripted turns need paravt's loop
        self.loop = loop
        self.program = program
        self.source = source
        self.workers = workers
        self.system = system
        self.max_new_tokens = max_new_tokens
        self.overview_max_pixels = overview_max_pixels
        self.rewards: dict[tuple[str, int], float] = {}  # (sample id, g) -> the agent's reward
        self.forks = 0
        self._serving = None
        self._pool: ThreadPoolExecutor | None = None
        self.url = ""

    @property
    def engine(self):
        """The engine the gateway samples with (the DataModule swaps it as it swaps a loop's)."""
        return self.gateway.batcher.engine

    @engine.setter
    def engine(self, engine) -> None:
        self.gateway.batcher.engine = engine
        if self.loop is not None:
            self.loop.engine = engine

    def __enter__(self) -> GatewayRollouts:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Start the server and the worker pool (once; `run` starts them if needed)."""
        if self._pool is None:
            self._serving = serving(self.gateway)
            self.url = self._serving.__enter__()
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="paravt-agent")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._serving.__exit__(None, None, None)
            self._pool = None

    def run(
        self,
        samples: Sequence[Sample],
        budgets: Sequence[int],
        group_size: int,
        params: SamplingParams,
        skip_bad_videos: bool = True,
        positions: Sequence[int] | None = None,
    ) -> AgentRun:
        """B * G rollouts by the agent program, group-major, as `AgentLoop.run` returns them
        (`skip_bad_videos` is accepted for its signature: a failed agent never stops a step).
        `positions`: each sample's index in the step's whole batch, as `AgentLoop.start` takes
        them; rollout g of the sample at position p samples from the seed stream the agent loop
        would give it, derive_seed(derive_seed(params.seed, p), g)."""
        positions = range(len(samples)) if positions is None else positions
        if len(positions) != len(samples):
            raise ValueError(f"got {len(positions)} positions for {len(samples)} samples")
        self.start()
        self._serve_videos_of(samples)
        t0 = time.perf_counter()
        turn = replace(params, n=1, max_new_tokens=min(params.max_new_tokens, self.max_new_tokens))
        jobs = []
        for sample, budget, p in zip(samples, budgets, positions, strict=True):
            payload = task_payload(
                sample, budget, self.source, self.system, self.overview_max_pixels
            )
            stream = derive_seed(params.seed, p)
            for g in range(group_size):
                eid = f"{sample.id}.{g}.{uuid.uuid4().hex[:8]}"
                eid = self.gateway.open(eid, payload, turn, seed=derive_seed(stream, g))
                self.gateway.episodes[eid].held = True  # until a worker plays it
                future = self._pool.submit(self._play, eid, payload)
                jobs.append((sample, g, budget, eid, future))
        errors: dict[str, str] = {}
        trajs = [self._collect(*job, errors) for job in jobs]
        return AgentRun(tuple(trajs), errors, {"agent": time.perf_counter() - t0})

    def _serve_videos_of(self, samples: Sequence[Sample]) -> None:
        """The media root: the folder holding every video of the step, and nothing wider."""
        folders = [os.path.dirname(os.path.realpath(s.video)) for s in samples]
        media = self.gateway.renderer.media
        self.gateway.renderer.media = replace(media, root=os.path.commonpath(folders))

    def _play(self, eid: str, payload: dict[str, Any]) -> Any:
        """The program's episode. It is held (never idle) while it waits for a worker and
        once the program returned, until `_collect` takes it: only the program's own time
        between its requests counts against the idle limit."""
        episode = self.gateway.get(eid)  # touched: idle from now on
        episode.held = False
        try:
            return self.program(f"{self.url}/episodes/{eid}/v1", payload)
        finally:
            episode.held = True

    def _outcome(self, eid: str, future) -> Any:
        """The program's return value; raises its error, or `TimeoutError` once the gateway
        closed the episode for idleness (the hung thread is left to end on its own)."""
        while True:
            try:
                return future.result(timeout=0.5)
            except TimeoutError:
                if eid not in self.gateway.episodes:
                    idle = self.gateway.episode_idle_s
                    raise TimeoutError(f"episode {eid} was idle for {idle:g} s: closed") from None

    def _collect(self, sample: Sample, g: int, budget: int, eid: str, future, errors) -> Trajectory:
        try:
            reward = self._outcome(eid, future)
            if eid not in self.gateway.episodes:  # it returned, but after the idle limit
                raise TimeoutError(f"episode {eid} was closed for idleness before it returned")
        except Exception as err:  # the agent's bug fails its rollout, not the step
            errors[sample.id] = f"agent program failed: {type(err).__name__}: {err}"
            with contextlib.suppress(HTTPError):
                self.gateway.finish(eid)
            return _failed(sample, g, budget)
        posted = self.gateway.get(eid).reward
        if posted is None and isinstance(reward, (int, float)):
            posted = float(reward)
        if posted is not None:
            self.rewards[(sample.id, g)] = posted
        forks = sum(self.gateway.get(eid).forks.values())
        self.forks += forks
        trajs = self.gateway.finish(eid, sample_id=sample.id, group_index=g, frame_budget=budget)
        if not trajs:
            errors[sample.id] = f"agent program of episode {eid} made no request"
            return _failed(sample, g, budget)
        # The rollout as the agent ended it (forked trajectories are context only), with the
        # reward it posted (reward.agent_reward says whether training reads it) and its forks.
        return replace(trajs[-1], agent_reward=posted, forks=forks)


def _failed(sample: Sample, group_index: int, budget: int) -> Trajectory:
    """The empty rollout of an agent program that failed: no tokens, scored as no answer (and
    0 as its agent's reward: it posted none that counts)."""
    return Trajectory(
        sample.id,
        group_index,
        (),
        (),
        (),
        (),
        0,
        finish_reason=AGENT_ERROR,
        frame_budget=budget,
        agent_reward=0.0,
    )


def build_rollouts(rollout, engine, processor) -> GatewayRollouts:
    """The rollouts of `rollout.agent_program` (a `RolloutConfig`) on `engine`: paravt's agent
    settings (`rollout.agent`: think prefix, system prompt, token cap, overview size) shape the
    payload and the rendering, so the same policy serves paravt's loop and the program."""
    from paravt.agent.loop import AgentLoop
    from paravt.agent.prompts import FORCED_THINK
    from paravt.agent.render import ChatRenderer
    from paravt.agent.tools import CropConfig
    from paravt.gateway.batcher import Batcher
    from paravt.gateway.episode import EpisodeRenderer
    from paravt.gateway.media import MediaConfig
    from paravt.video.reader import VideoReader

    agent, crop = rollout.agent, rollout.crop or CropConfig()
    # httpx (httpx2 under openai 3) logs each request at INFO: every turn of every rollout in
    # the run's log; warnings and errors still show.
    for name in ("httpx", "httpx2"):
        logging.getLogger(name).setLevel(logging.WARNING)
    renderer = ChatRenderer(processor)
    # The root is narrowed to each step's video folder before its episodes open.
    media = MediaConfig(os.sep, agent.overview_max_pixels, renderer.frame_factor)
    prefix = FORCED_THINK if agent.force_think else ""
    episodes = EpisodeRenderer(
        renderer, VideoReader(), media, prefix, crop.max_calls_per_turn, agent.tool_dialect
    )
    gateway = Gateway(
        episodes,
        Batcher(engine),
        max_new_tokens=agent.max_new_tokens,
        episode_idle_s=rollout.agent_idle_s,
    )
    return GatewayRollouts(
        gateway,
        load_program(rollout.agent_program),
        episodes.source,
        rollout.agent_workers,
        agent.system,
        agent.max_new_tokens,
        agent.overview_max_pixels,
        AgentLoop(engine, renderer, episodes.source, agent, crop, tools=rollout.toolbox),
    )
