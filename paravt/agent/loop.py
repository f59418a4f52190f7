"""The multi-turn, parallel-tool agent loop: B prompts x G samples, round by round, token-exact.

One round = one batched engine call for every active trajectory -> parse each turn's calls ->
one `run_many` of the executor for all calls of all trajectories (concurrent crops) -> in
sub-agent mode one batched engine call for every successful crop -> append each trajectory's
next context segment (tool responses rendered together, mask 0) -> next round. After the last
tool round the tool responses are followed by a forced-answer message. A trajectory whose next
turn could exceed `max_total_tokens` stops and is marked truncated. A sample whose overview
frames fail to decode raises `VideoError`, or with `skip_bad_videos` gets G empty `VIDEO_ERROR`
trajectories so the other samples' rollouts go on (crops that fail are tool errors, as always).

The loop deliberately knows nothing of rewards or training; it returns `Trajectory` objects.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from paravt.agent import prompts
from paravt.agent.parsing import check_dialect, parse_tool_calls
from paravt.agent.render import ChatRenderer, Segment
from paravt.agent.toolkit import build_toolbox, toolbox_system
from paravt.agent.tools import CropCache, CropConfig, CropVideoTool, ParallelToolExecutor, Tool
from paravt.errors import VideoError
from paravt.rollout.engine import (
    GenerationOutput,
    GenerationRequest,
    RolloutEngine,
    SamplingParams,
    derive_seed,
)
from paravt.types import (
    AgentRun,
    Frames,
    ParsedCall,
    Sample,
    ToolResult,
    Trajectory,
    Turn,
    Visual,
)
from paravt.video.sampling import overview_indices

MODES = ("frames", "subagent")
VIDEO_ERROR = "video_error"  # finish_reason of the empty trajectories of an undecodable video


@dataclass(frozen=True)
class AgentConfig:
    """Agent settings (docs/method.md sections 2 and 6); crops are configured by `CropConfig`.

    The defaults are conf/rollout/default.yaml's (a test compares them). The call cap per turn
    is `CropConfig.max_calls_per_turn` (1: sequential dispatch), not a field here."""

    max_rounds: int = 3
    mode: str = "frames"
    force_think: bool = True
    max_new_tokens: int = 2048
    max_total_tokens: int = 32768
    subagent_max_tokens: int = 512
    overview_max_pixels: int = 50176
    forced_answer: str = prompts.FORCED_ANSWER
    forced_answer_max_tokens: int | None = None  # cap of the forced turn (None: max_new_tokens)
    tools: bool = True  # False: no tool in the system prompt and no call parsed (no-tool ablation)
    system: str | None = None  # the system prompt; None: prompts.system_prompt() (tool schema)
    # True: the tool is offered (same prompt) but its calls never run; the turn that makes them
    # gets the forced-answer message alone and the next turn must answer (the "same policy,
    # forced to answer without tools" ablation, `mode=tools_denied`).
    deny_calls: bool = False
    # How `<tool_code>` blocks are read (paravt.agent.parsing.DIALECTS): "any" both tags, one
    # call per block; "lines" one call per line of a `<tool_code>` block (a prior's form);
    # "tool_call" only `<tool_call>` runs, a `<tool_code>` block gets an error back.
    tool_dialect: str = "any"

    def __post_init__(self) -> None:
        check_dialect(self.tool_dialect)
        if self.mode not in MODES:
            raise ValueError(f"agent mode {self.mode!r} is unknown: choose one of {MODES}")
        if self.max_rounds < 0:
            raise ValueError(f"max_rounds must be >= 0, got {self.max_rounds}")
        if self.deny_calls and (not self.tools or self.max_rounds < 1):
            raise ValueError(
                "deny_calls needs tools=true and max_rounds >= 1 (the denied calls' turn is "
                f"followed by a forced answer), got tools={self.tools}, "
                f"max_rounds={self.max_rounds}"
            )


@dataclass
class _State:
    """A trajectory under construction (mutable, private to the loop)."""

    sample: Sample
    group_index: int
    budget: int
    prompt_length: int
    ids: list[int]
    mask: list[int]
    logp: list[float]
    versions: list[int]  # the engine's weight version when each token was appended
    visuals: list[Visual]
    history: list[dict[str, Any]]
    turns: list[Turn] = field(default_factory=list)
    subs: list[Trajectory] = field(default_factory=list)
    prefix: str = ""
    done: bool = False
    truncated: bool = False
    finish_reason: str = "stop"
    forced: bool = False
    seed: int | None = None  # the trajectory's seed stream (None: unseeded)

    def append(self, seg: Segment, version: int) -> None:
        self.ids += seg.token_ids
        self.mask += [0] * len(seg.token_ids)
        self.logp += [0.0] * len(seg.token_ids)
        self.versions += [version] * len(seg.token_ids)
        self.visuals += seg.visuals

    def seed_of(self, turn: int, call: int = 0) -> int | None:
        """The seed of turn `turn` (call 0) or of sub-agent call `call` on its crops: drawn
        from this trajectory's own stream, so no round, sub-agent call or other step merged
        into the same engine call reuses it."""
        return derive_seed(self.seed, turn, call)

    @property
    def name(self) -> str:
        return f"trajectory {self.sample.id}#{self.group_index}"

    def request(self) -> GenerationRequest:
        seed = self.seed_of(len(self.turns))
        return GenerationRequest(tuple(self.ids), tuple(self.visuals), self.name, seed)


@dataclass
class Rounds:
    """The rollouts of one `AgentLoop.start` between rounds (mutable; read it through the
    loop's `advance` and `finish`)."""

    groups: list  # [B] G _States each, or G VIDEO_ERROR trajectories
    params: SamplingParams  # as the caller gave them (sub-agent calls use them)
    turn_params: SamplingParams  # one sample per request, the agent's token cap
    errors: dict[str, str]
    timings: dict[str, float]
    round_index: int = 0
    done: bool = False

    def active(self, fits) -> list[_State]:
        """The trajectories that take the next round (`fits` marks those out of room done)."""
        states = (st for group in self.groups for st in group if isinstance(st, _State))
        return [st for st in states if not st.done and fits(st)]


class AgentLoop:
    """Runs grouped rollouts of the main agent with the configured engine and tools."""

    def __init__(
        self,
        engine: RolloutEngine,
        renderer: ChatRenderer,
        source,
        cfg: AgentConfig = AgentConfig(),
        crop: CropConfig | None = None,
        executor: ParallelToolExecutor | None = None,
        crop_cache: CropCache | None = None,
        tools: Sequence[Tool] | None = None,
    ):
        """`crop_cache`: decoded crops shared by the rollouts (ignored with an `executor`);
        `tools`: the agent's tools (`rollout.toolbox`; None: `[crop_video]`, the paper's)."""
        self.engine = engine
        self.renderer = renderer
        self.source = source
        self.cfg = cfg
        # The crop grid is the model's (patch x merge), read from its processor, never from YAML.
        self.crop = replace(crop or CropConfig(), factor=renderer.frame_factor)
        self.executor = executor or ParallelToolExecutor(
            build_toolbox(tools or (CropVideoTool(),)), source, self.crop, crop_cache
        )
        self.system = toolbox_system(cfg.system, self.executor.tools)
        self.tokenizer = renderer.tokenizer
        self.end_of_turn = renderer.end_of_turn

    # ---- public -------------------------------------------------------------------------
    def run(
        self,
        samples: Sequence[Sample],
        budgets: Sequence[int],
        group_size: int,
        params: SamplingParams,
        skip_bad_videos: bool = False,
        positions: Sequence[int] | None = None,
    ) -> AgentRun:
        """N = len(samples) * group_size trajectories, grouped by sample (group-major order),
        with what the run measured (an `AgentRun`, itself a sequence of the trajectories).

        A video that fails to decode raises `VideoError`, unless `skip_bad_videos`: then each of
        that sample's G trajectories is empty with finish_reason `VIDEO_ERROR`, and the result's
        `video_errors` maps its id to the error (which names the file). `positions`: see `start`.
        """
        run = self.start(samples, budgets, group_size, params, skip_bad_videos, positions)
        while not run.done:
            self.advance([run])
        return self.finish(run)

    def start(
        self,
        samples: Sequence[Sample],
        budgets: Sequence[int],
        group_size: int,
        params: SamplingParams,
        skip_bad_videos: bool = False,
        positions: Sequence[int] | None = None,
    ) -> Rounds:
        """The rollouts of `samples` before their first round (`run`'s arguments); `advance`
        plays their rounds, `finish` returns them.

        `positions`: each sample's index in the step's whole batch, every rank's share (default
        0, 1, ...). Trajectory g of the sample at position p samples from the seed stream
        (`params.seed`, p, g), each turn and sub-agent call with its own seed (`_State.seed_of`):
        no two requests of a step share a seed, on any rank, and none depends on the world size.
        """
        positions = range(len(samples)) if positions is None else positions
        if len(budgets) != len(samples) or len(positions) != len(samples):
            raise ValueError(
                f"got {len(budgets)} frame budgets and {len(positions)} positions for "
                f"{len(samples)} samples"
            )
        timings: dict[str, float] = defaultdict(float)  # seconds per phase
        errors: dict[str, str] = {}
        t0 = time.perf_counter()
        seeds = [derive_seed(params.seed, p) for p in positions]
        groups = [
            self._start_group(s, k, group_size, skip_bad_videos, errors, seed)
            for s, k, seed in zip(samples, budgets, seeds, strict=True)
        ]
        timings["prompt"] += time.perf_counter() - t0
        turn_params = replace(params, n=1, max_new_tokens=self.cfg.max_new_tokens)
        return Rounds(groups, params, turn_params, errors, timings)

    def advance(self, runs: Sequence[Rounds]) -> None:
        """One agent round of every unfinished run in `runs`, with ONE engine call for all of
        their active trajectories (partial rollouts merge the rounds of several steps, streaming
        those of the groups in flight; the call samples with the first run's parameters, each
        request with its own trajectory's seed stream), then ONE executor round for all of their
        tool calls. Between two calls nothing is in flight: the engine's weights may change there
        (a turn boundary), and every sampled token records the version that sampled it."""
        active = {id(r): r.active(self._fits) for r in runs if not r.done}
        for r in runs:
            r.done = r.done or not active.get(id(r))
        live = [r for r in runs if not r.done]
        if not live:
            return
        everyone = [st for r in live for st in active[id(r)]]
        t0 = time.perf_counter()
        outputs = iter(self._generate(everyone, live[0].turn_params))
        spent = time.perf_counter() - t0
        version = int(getattr(self.engine, "weight_version", 0))
        turns = []
        for r in live:
            r.timings["generate"] += spent
            with_calls = [
                (st, calls)
                for st in active[id(r)]
                if (calls := self._take_turn(st, next(outputs)[0], r.round_index, version))
            ]
            turns.append((r, with_calls))
        self._run_tools(turns)
        for r in live:
            r.round_index += 1
            r.done = r.round_index > self.cfg.max_rounds

    def finish(self, run: Rounds) -> AgentRun:
        """The trajectories of a run whose rounds are over, group-major."""
        trajs = tuple(
            self._finish(st) if isinstance(st, _State) else st
            for group in run.groups
            for st in group
        )
        return AgentRun(trajs, run.errors, dict(run.timings))

    def _start_group(
        self,
        sample: Sample,
        budget: int,
        group_size: int,
        skip_bad_videos: bool,
        errors: dict[str, str],
        seed: int | None,
    ) -> list[_State] | list[Trajectory]:
        """The G starting states of `sample` (trajectory g's seed stream derived from `seed`), or
        G empty trajectories when its video fails."""
        try:
            return self._start(sample, budget, group_size, seed)
        except VideoError as error:
            if not skip_bad_videos:
                raise
            errors[sample.id] = str(error)
            return [_video_error(sample, g, budget) for g in range(group_size)]

    # ---- phases -------------------------------------------------------------------------
    def _generate(self, active: Sequence[_State], params: SamplingParams):
        """One engine call for the round; forced-answer turns get their own call when they have
        their own token cap (docs/evaluation.md: 64 tokens for a letter, 128 for an interval)."""
        cap = self.cfg.forced_answer_max_tokens
        forced = [i for i, st in enumerate(active) if st.forced] if cap else []
        if not forced:
            return self.engine.generate([st.request() for st in active], params)
        free = sorted(set(range(len(active))) - set(forced))
        outputs: list = [None] * len(active)
        for group, p in ((free, params), (forced, replace(params, max_new_tokens=cap))):
            if group:
                for i, out in zip(
                    group,
                    self.engine.generate([active[i].request() for i in group], p),
                    strict=True,
                ):
                    outputs[i] = out
        return outputs

    def _start(
        self, sample: Sample, budget: int, group_size: int, seed: int | None
    ) -> list[_State]:
        info = self.source.info(sample.video)
        indices = overview_indices(info.num_frames, budget)
        frames = self.source.read(
            sample.video, indices, self.cfg.overview_max_pixels, self.renderer.frame_factor
        )
        system = self.system if self.cfg.tools else prompts.NO_TOOL_SYSTEM
        messages = prompts.main_messages(sample, frames.timestamps, info.duration, system)
        prefix = prompts.FORCED_THINK if self.cfg.force_think else ""
        seg = self.renderer.prompt(messages, [frames], prefix)
        version = self._version()
        return [
            _State(
                sample=sample,
                group_index=g,
                budget=budget,
                prompt_length=len(seg.token_ids),
                ids=list(seg.token_ids),
                mask=[0] * len(seg.token_ids),
                logp=[0.0] * len(seg.token_ids),
                versions=[version] * len(seg.token_ids),
                visuals=list(seg.visuals),
                history=list(messages),
                prefix=prefix,
                seed=derive_seed(seed, g),
            )
            for g in range(group_size)
        ]

    def _fits(self, st: _State) -> bool:
        if len(st.ids) + self.cfg.max_new_tokens <= self.cfg.max_total_tokens:
            return True
        st.done, st.truncated, st.finish_reason = True, True, "truncated"
        return False

    def _version(self) -> int:
        return int(getattr(self.engine, "weight_version", 0))

    def _take_turn(
        self, st: _State, out: GenerationOutput, round_index: int, version: int
    ) -> tuple[ParsedCall, ...]:
        """Append the sampled tokens (sampled by weight `version`); return the turn's calls
        when tools must run."""
        st.ids += out.token_ids
        st.mask += [1] * len(out.token_ids)
        st.logp += out.logprobs
        st.versions += [sampled_by(out, version)] * len(out.token_ids)
        body = self.tokenizer.decode(list(out.token_ids), skip_special_tokens=False)
        if body.endswith(self.end_of_turn):
            body = body[: -len(self.end_of_turn)]
        text = st.prefix + body
        st.history.append({"role": "assistant", "content": text})
        cap = self.crop.max_calls_per_turn  # the one call-cap knob (1: sequential dispatch)
        calls = ()
        if not st.forced and self.cfg.tools:
            known = self.executor.names
            calls = parse_tool_calls(text, cap, known, dialect=self.cfg.tool_dialect)
        st.turns.append(Turn(text=text, calls=calls, forced_answer=st.forced))
        if out.finish_reason != "stop":
            st.done, st.finish_reason = True, out.finish_reason
            return ()
        if not calls or round_index >= self.cfg.max_rounds:
            st.done = True
            return ()
        return calls

    def _run_tools(
        self, turns: Sequence[tuple[Rounds, Sequence[tuple[_State, tuple[ParsedCall, ...]]]]]
    ) -> None:
        """Every run's tool calls of this round in one `run_many` (concurrent across runs as
        within one: the executor's limits hold for the whole round), each run then given its
        results under its own round and sampling parameters."""
        every = [(calls, st.sample.video) for _, with_calls in turns for st, calls in with_calls]
        if not every or self.cfg.deny_calls:  # denied: no crop runs, a forced answer next
            for _, with_calls in turns:
                for st, _ in with_calls:
                    self._append_responses(st, (), last=True)
            return
        t0 = time.perf_counter()
        results = iter(self.executor.run_many(every))
        spent = time.perf_counter() - t0
        for r, with_calls in turns:
            mine = [next(results) for _ in with_calls]
            if with_calls:
                r.timings["tools"] += spent
                self._deliver(with_calls, mine, r.round_index, r.params, r.timings)

    def _deliver(
        self,
        with_calls: Sequence[tuple[_State, tuple[ParsedCall, ...]]],
        results: list,
        round_index: int,
        params: SamplingParams,
        timings: dict[str, float],
    ) -> None:
        if self.cfg.mode == "subagent":
            t0 = time.perf_counter()
            results = self._summarise(with_calls, results, params)
            timings["subagent"] += time.perf_counter() - t0
        last_round = round_index + 1 >= self.cfg.max_rounds
        for (st, _), res in zip(with_calls, results, strict=True):
            st.turns[-1] = replace(st.turns[-1], results=res)
            self._append_responses(st, res, last_round)

    def _append_responses(self, st: _State, results: Sequence[ToolResult], last: bool) -> None:
        messages = [prompts.tool_message(r, self.cfg.mode) for r in results]
        if last:
            messages.append(prompts.forced_answer_message(self.cfg.forced_answer))
            st.forced = True
        clips: list[Frames] = []
        if self.cfg.mode == "frames":
            clips = [r.frames for r in results if r.ok and r.frames is not None]
        seg = self.renderer.continuation(st.history, messages, clips, st.prefix)
        if len(st.ids) + len(seg.token_ids) > self.cfg.max_total_tokens:
            st.done, st.truncated, st.finish_reason = True, True, "truncated"
            return
        st.history.extend(messages)
        st.append(seg, self._version())

    def _summarise(self, with_calls, results, params: SamplingParams):
        """One batched sub-agent generation for every successful crop of every trajectory."""
        jobs = [
            (i, j, r)
            for i, res in enumerate(results)
            for j, r in enumerate(res)
            if r.ok and r.frames is not None
        ]
        if not jobs:
            return results
        segs = [
            self.renderer.prompt(prompts.subagent_messages(*r.window), [r.frames])
            for _, _, r in jobs
        ]
        sub_params = replace(params, n=1, max_new_tokens=self.cfg.subagent_max_tokens)
        owners = [with_calls[i][0] for i, _, _ in jobs]
        requests = [  # crop j of the owner's last turn: sub-agent call j + 1 of that turn
            GenerationRequest(
                s.token_ids,
                s.visuals,
                f"{st.name} sub-agent {j + 1}",
                st.seed_of(len(st.turns) - 1, j + 1),
            )
            for st, (_, j, _), s in zip(owners, jobs, segs, strict=True)
        ]
        outs = self.engine.generate(requests, sub_params)
        new = [list(res) for res in results]
        version = self._version()
        for (i, j, r), seg, out in zip(jobs, segs, outs, strict=True):
            o = out[0]
            text = self.tokenizer.decode(list(o.token_ids), skip_special_tokens=True).strip()
            new[i][j] = replace(r, summary=text)
            with_calls[i][0].subs.append(_sub_trajectory(with_calls[i][0], seg, o, text, version))
        return [tuple(res) for res in new]

    def _finish(self, st: _State) -> Trajectory:
        calls = [c for t in st.turns for c in t.calls]
        responses = [r for t in st.turns for r in t.results if r.ok]
        return Trajectory(
            sample_id=st.sample.id,
            group_index=st.group_index,
            token_ids=tuple(st.ids),
            loss_mask=tuple(st.mask),
            logprobs=tuple(st.logp),
            visuals=tuple(st.visuals),
            prompt_length=st.prompt_length,
            versions=tuple(st.versions),
            turns=tuple(st.turns),
            num_calls=len(calls),
            num_valid_calls=sum(c.ok for c in calls),
            num_tool_responses=len(responses),
            num_rounds=sum(1 for t in st.turns if t.calls),
            truncated=st.truncated,
            finish_reason=st.finish_reason,
            frame_budget=st.budget,
            sub_trajectories=tuple(st.subs),
        )


def sampled_by(out: GenerationOutput, engine_version: int) -> int:
    """The weight version that sampled `out`: the one its engine reported for it (rollout
    servers: several servers in one call may hold different versions, and another client may
    have synced one), else the engine's version after the call."""
    return engine_version if out.version is None else out.version


def _sub_trajectory(
    parent: _State, seg: Segment, out: GenerationOutput, text: str, version: int
) -> Trajectory:
    n_prompt = len(seg.token_ids)
    return Trajectory(
        sample_id=parent.sample.id,
        group_index=parent.group_index,
        token_ids=seg.token_ids + out.token_ids,
        loss_mask=(0,) * n_prompt + (1,) * len(out.token_ids),
        logprobs=(0.0,) * n_prompt + out.logprobs,
        visuals=seg.visuals,
        prompt_length=n_prompt,
        versions=(version,) * n_prompt + (sampled_by(out, version),) * len(out.token_ids),
        turns=(Turn(text=text),),
        finish_reason=out.finish_reason,
        frame_budget=parent.budget,
    )


def _video_error(sample: Sample, group_index: int, budget: int) -> Trajectory:
    """The placeholder rollout of a sample whose video failed: no tokens, scored as no answer."""
    return Trajectory(
        sample_id=sample.id,
        group_index=group_index,
        token_ids=(),
        loss_mask=(),
        logprobs=(),
        visuals=(),
        prompt_length=0,
        finish_reason=VIDEO_ERROR,
        frame_budget=budget,
    )
