"""The asynchronous rollout generator: its own process, engine, cores and threads.

`AsyncGenerator` (the trainer's handle) spawns `generator_main` with torch.multiprocessing
(spawn). The child is no rank of the trainer's launch: it first drops the launcher's variables it
inherited (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*, TORCHELASTIC_*, SLURM_PROCID, ...:
`paravt.parallel.placement.without_launch_vars`, which the rollout servers share), so its
engine is a standalone one, never a member of the trainer's process group, and it sees only the
trainer rank's GPU (`standalone_env`). It loads the policy's architecture and processor onto that
device (`generator_device`: the trainer rank's CUDA device, else the CPU), copies the trainer's
current weights from `SharedWeights`, builds its own engine and agent loop, pins itself to its
cores, and then runs `GenTask`s in order: before each task it loads the newest published
weights, and it sends a `GenResult` (grouped trajectories + the version they were sampled under
+ busy time) back, queueing at most `max_pending` while the trainer has not read them. Which
steps may start is decided by the trainer (`paravt.rollout.sync.staleness`). With `rollout.partial`
the submitted steps are played together, a round at a time, and the weights may change between
rounds (`paravt.generator.partial_rollouts`); with `rollout.mode=stream` groups are in flight on
a rolling basis and the trainer takes whole groups (`paravt.generator.streaming`).

Failure behaviour: an exception in the child is sent back as a `GenFailure` and re-raised by
`take` (with the child's traceback); a child that dies silently is noticed within a second,
even in the middle of sending a result: results come over a one-way pipe whose only write end
is the child's (`_Outbox`), so a half-sent message ends in EOF instead of a read that waits
forever (a multiprocessing Queue's pipe keeps a write end open in the parent too). The child
ignores Ctrl-C (the trainer closes it) and exits by itself when its parent dies (kill -9), so
no orphan is left. It deliberately knows nothing of Lightning or rewards.
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import signal
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from paravt.generator.messages import GenFailure, GenResult, GenStarved, GenTask
from paravt.parallel.placement import visible_gpus, without_launch_vars

POLL_S = 0.5


@dataclass(frozen=True)
class GeneratorSpec:
    """What the child needs to build its engine and agent (all picklable)."""

    policy: object  # paravt.models.loading.PolicySpec
    engine: object  # paravt.rollout.factory.EngineConfig
    agent: object  # paravt.agent.loop.AgentConfig
    crop: object  # paravt.agent.tools.CropConfig
    cores: tuple[int, ...]
    threads: int
    skip_bad_videos: bool = True
    device: str = "cpu"  # the trainer rank's device (`generator_device`)
    partial: bool = False  # rollout.partial: steps in flight together (modules/partial_rollouts)
    tools: tuple = ()  # rollout.toolbox (empty: the default [crop_video])
    stream: object = None  # rollout.mode=stream: its StreamLimits (generator/streaming.py)


class _Outbox:
    """The child's end of the result pipe: `put` queues (blocking while `max_pending` are
    queued), a thread sends, so the child generates the next step while the trainer has not
    read the last one yet; `close` waits until everything queued is sent."""

    def __init__(self, conn, max_pending: int):
        self.conn = conn
        self.items: queue.Queue = queue.Queue(maxsize=max(1, max_pending))
        self.thread = threading.Thread(target=self._send, daemon=True, name="paravt-outbox")
        self.thread.start()

    def _send(self) -> None:
        with contextlib.suppress(OSError):  # the trainer closed its end: nothing to send to
            while (item := self.items.get()) is not None:
                self.conn.send(item)

    def put(self, item) -> None:
        while self.thread.is_alive():
            with contextlib.suppress(queue.Full):
                self.items.put(item, timeout=POLL_S)
                return
        raise BrokenPipeError("the trainer stopped reading rollouts")

    def close(self) -> None:
        with contextlib.suppress(BrokenPipeError):
            self.put(None)
        self.thread.join()
        self.conn.close()


def generator_device(trainer_device) -> str:
    """Where the generator's engine goes: the trainer rank's CUDA device, else the CPU."""
    import torch

    device = torch.device(trainer_device)
    if device.type != "cuda":
        return "cpu"
    index = torch.cuda.current_device() if device.index is None else device.index
    return f"cuda:{index}"


def standalone_env(environ: Mapping[str, str], device: str) -> tuple[dict[str, str], str]:
    """(the child's environment, its device there): the launcher's variables dropped; on
    `cuda:k`, CUDA_VISIBLE_DEVICES narrowed to that one GPU, which the child calls `cuda:0`
    (vLLM's single-process engine always takes the first visible device)."""
    env = without_launch_vars(environ)
    if not device.startswith("cuda"):
        return env, "cpu"
    env["CUDA_VISIBLE_DEVICES"] = visible_gpus(environ, [int(device.partition(":")[2] or 0)])
    return env, "cuda:0"


def _enter_standalone(device: str) -> str:
    """Apply `standalone_env` to this process (before anything touches CUDA); its device."""
    env, local = standalone_env(os.environ, device)
    os.environ.clear()
    os.environ.update(env)
    return local


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)
    os._exit(3)  # the trainer is gone (kill -9): leave no orphan


def _pin(cores: Sequence[int], threads: int) -> None:
    import torch

    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(cores))
    torch.set_num_threads(max(1, threads))


def _build(spec: GeneratorSpec, weights, device: str = "cpu"):
    """The child's policy copy on `device`, its engine and agent loop."""
    from paravt.agent.loop import AgentLoop
    from paravt.agent.render import ChatRenderer
    from paravt.models.loading import load_policy
    from paravt.rollout.factory import build_engine
    from paravt.rollout.sync.weight_sync import WeightSync
    from paravt.video.reader import VideoReader

    model, processor = load_policy(spec.policy)
    model.requires_grad_(False).eval().to(device)
    version = weights.load_into(model, everything=True)
    engine = build_engine(spec.engine, model, processor, spec.policy.path, share_weights=True)
    WeightSync.changed(engine, model, version)  # the shared copy's weights, not the path's
    agent = AgentLoop(
        engine, ChatRenderer(processor), VideoReader(), spec.agent, spec.crop, tools=spec.tools
    )
    return model, engine, agent


def serve_steps(tasks, results, weights, model, engine, agent, skip_bad_videos: bool) -> None:
    """Serve `tasks` one step at a time, each with the newest weights at its start, until the
    stop signal (None); `results.put` sends each step's `GenResult`."""
    from paravt.rollout.sync.weight_sync import WeightSync

    while (task := tasks.get()) is not None:
        WeightSync.into_generator(engine, model, weights)
        # before the run: an engine whose weights may move forward during it (shared rollout
        # servers) then records the oldest weights any token was sampled with
        version = engine.weight_version
        t0 = time.perf_counter()
        run = agent.run(
            list(task.samples),
            list(task.budgets),
            task.group_size,
            task.params,
            skip_bad_videos=skip_bad_videos,
            positions=task.positions,
        )
        busy = time.perf_counter() - t0
        timings = {f"rollout_{k}": v for k, v in run.timings.items()}
        errors = dict(run.video_errors)
        results.put(GenResult(task.step, version, tuple(run), errors, busy, timings))


def generator_main(
    spec: GeneratorSpec, weights, tasks, conn, max_pending: int, parent: int
) -> None:
    """The child process: build, then serve tasks until a None arrives; results go out over
    `conn`, the write end of the result pipe."""

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    results = _Outbox(conn, max_pending)
    try:
        device = _enter_standalone(spec.device)
        _pin(spec.cores, spec.threads)
        model, engine, agent = _build(spec, weights, device)
        serve = serve_steps
        if spec.stream is not None:
            from paravt.generator.streaming import serve_stream

            serve = functools.partial(serve_stream, limits=spec.stream)
        elif spec.partial:
            from paravt.generator.partial_rollouts import serve_partial as serve
        serve(tasks, results, weights, model, engine, agent, spec.skip_bad_videos)
    except BaseException:
        with contextlib.suppress(BrokenPipeError):
            results.put(GenFailure(traceback.format_exc()))
    finally:
        with contextlib.suppress(OSError):
            results.close()


class GeneratorError(RuntimeError):
    """The rollout generator process failed; training stops with its error."""


class AsyncGenerator:
    """The trainer's handle on one generator process."""

    def __init__(self, spec: GeneratorSpec, weights, max_pending: int, main=None):
        """`main`: the child's entry point, `generator_main` unless a test starts another with
        the same arguments."""
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.tasks = ctx.Queue()
        self.results, child_end = ctx.Pipe(duplex=False)
        self.process = ctx.Process(
            target=main or generator_main,
            args=(spec, weights, self.tasks, child_end, max_pending, os.getpid()),
            daemon=True,
            name="paravt-rollout-generator",
        )
        self.process.start()
        child_end.close()  # the child's is then the only write end: its death reads as EOF
        self.pid = self.process.pid

    def submit(self, task: GenTask) -> None:
        self.tasks.put(task)

    def take(
        self, step: int, timeout_s: float | None = None, on_starved=None
    ) -> tuple[GenResult, float]:
        """The result of `step` (the next one due) and the seconds waited for it; a
        `GenStarved` that comes meanwhile calls `on_starved()` (rollout.mode=stream)."""
        t0 = time.perf_counter()
        while True:
            try:
                got = self.results.recv() if self.results.poll(POLL_S) else None
            except (EOFError, OSError):  # the child is gone, maybe in the middle of a message
                self.process.join(POLL_S)
                got = None
            if got is None:
                if not self.process.is_alive():
                    raise GeneratorError(
                        f"the rollout generator process (pid {self.pid}) died with exit code "
                        f"{self.process.exitcode} before sending step {step}"
                    )
                if timeout_s is not None and time.perf_counter() - t0 > timeout_s:
                    raise GeneratorError(
                        f"the rollout generator process (pid {self.pid}) is running but sent no "
                        f"rollouts for step {step} in {timeout_s:g} s "
                        "(rollout.generator_timeout_s); stopping it"
                    )
                continue
            if isinstance(got, GenFailure):
                raise GeneratorError(f"the rollout generator failed:\n{got.error}")
            if isinstance(got, GenStarved):
                on_starved()
                continue
            if got.step != step:
                raise GeneratorError(f"rollouts arrived for step {got.step}, expected {step}")
            return got, time.perf_counter() - t0

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the child (politely, then by force) and wait for it. The result pipe is closed
        first: a result still being sent then fails in the child instead of holding it up."""
        self.results.close()
        if self.process.is_alive():
            with contextlib.suppress(OSError, ValueError):
                self.tasks.put(None)
            self.process.join(timeout_s)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout_s)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.tasks.cancel_join_thread()
        self.tasks.close()
