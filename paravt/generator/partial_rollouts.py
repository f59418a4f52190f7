"""Partial rollouts (`rollout.partial=true`): the generator's loop when trajectories outlive a
weight sync.

Without it the generator plays one step's rollouts start to finish with one set of weights
(`paravt.generator.worker.serve_steps`): a step's long tail of multi-turn trajectories runs
alone, and the next step waits for it. Here every submitted step stays in flight and the agent
plays ONE round for all of them in one engine call (`AgentLoop.advance`). Between two rounds
nothing is in flight (a turn boundary): there the newest published weights are loaded, so the
in-flight trajectories pause, the engine takes the new weights in place (`sync_weights`: with
vLLM its in-process weight load, never an engine restart) and they resume with them; every
token records the version that sampled it (`Trajectory.versions`), and the trainer checks the
staleness bound on the oldest one (`paravt.rollout.sync.staleness.oldest_version`). A new step joins
at the next round, so one step's tail shares its engine calls with the next step's first turns.
Results still go back whole and in step order: a step is sent once all its trajectories end.

What it deliberately does not do: keep a trajectory across a generator restart. Trajectories in
flight live in this process only; a run killed and resumed from its checkpoint starts a fresh
generator that regenerates every untrained step from its prompts, so nothing half-generated is
ever trained on.
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass

from paravt.generator.messages import GenResult, GenTask
from paravt.rollout.sync.staleness import oldest_version
from paravt.rollout.sync.weight_sync import WeightSync


@dataclass
class _InFlight:
    task: GenTask
    rounds: object  # paravt.agent.loop.Rounds
    busy_s: float = 0.0  # generator time of the rounds this step took part in


def _new_tasks(tasks, block: bool) -> list[GenTask] | None:
    """The tasks queued now (waiting for one when `block`); None once the stop signal came."""
    got = []
    try:
        item = tasks.get() if block else tasks.get_nowait()
        while True:
            if item is None:
                return None
            got.append(item)
            item = tasks.get_nowait()
    except queue.Empty:
        return got


def _result(agent, engine, flight: _InFlight) -> GenResult:
    run = agent.finish(flight.rounds)
    trajs = tuple(run)
    timings = {f"rollout_{k}": v for k, v in run.timings.items()}
    version = oldest_version(trajs, default=engine.weight_version)
    return GenResult(
        flight.task.step, version, trajs, dict(run.video_errors), flight.busy_s, timings
    )


def serve_partial(tasks, results, weights, model, engine, agent, skip_bad_videos: bool) -> None:
    """Serve `tasks` until the stop signal, all submitted steps in flight at once (see the
    module doc); `results.put` sends a finished step's `GenResult`."""
    flight: list[_InFlight] = []
    while (new := _new_tasks(tasks, block=not flight)) is not None:
        WeightSync.into_generator(engine, model, weights)  # a turn boundary: pause, sync, resume
        for task in new:
            t0 = time.perf_counter()
            rounds = agent.start(
                list(task.samples),
                list(task.budgets),
                task.group_size,
                task.params,
                skip_bad_videos=skip_bad_videos,
                positions=task.positions,
            )
            flight.append(_InFlight(task, rounds, time.perf_counter() - t0))
        t0 = time.perf_counter()
        agent.advance([f.rounds for f in flight])
        spent = time.perf_counter() - t0
        for f in flight:
            f.busy_s += spent
        while flight and flight[0].rounds.done:
            results.put(_result(agent, engine, flight.pop(0)))
