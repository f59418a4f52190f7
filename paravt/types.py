"""Types that cross module boundaries, and the shape letters used in annotations.

Shape letters (used in comments beside tensor arguments everywhere in paravt):
    B  prompts in a batch
    G  rollouts per prompt (the GRPO group)
    N  trajectories, N = B * G
    T  tokens (padded sequence length)
    K  frames (overview budget or crop frames)
    H, W  frame height and width in pixels

This module holds plain frozen dataclasses only: no torch, no framework imports, so that every
layer (pure core and glue) can depend on it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

QuestionType = Literal["mcq", "tvg", "oe"]
QUESTION_TYPES: tuple[str, ...] = ("mcq", "tvg", "oe")


@dataclass(frozen=True)
class Sample:
    """One RL / evaluation prompt: a video, a question and its ground truth.

    `question` is the full user text (options included, as the model sees it). `options` holds the
    option texts without letters when the question is multiple choice. `windows` are the
    ground-truth time windows in seconds (needles, grounding targets); empty when unknown.
    """

    id: str
    video: str
    question: str
    answer: str
    question_type: QuestionType = "mcq"
    options: tuple[str, ...] = ()
    windows: tuple[tuple[float, float], ...] = ()
    data_source: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolCall:
    """A syntactically valid tool call as the model wrote it (arguments already normalised)."""

    name: str
    arguments: Mapping[str, Any]


@dataclass(frozen=True)
class ParsedCall:
    """One call block of an assistant turn: either a valid `call` or an `error` message.

    `raw` is the block's text as written; `index` its position among the turn's blocks.
    """

    index: int
    raw: str
    call: ToolCall | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.call is not None and self.error is None


@dataclass(frozen=True)
class Frames:
    """Decoded frames of one video with their true positions.

    `pixels` is a uint8 numpy array [K, H, W, 3]; `indices` are frame indices in the source video
    and `timestamps` their times in seconds; `fps` is the source video's average frame rate.
    """

    pixels: Any  # np.ndarray [K, H, W, 3] uint8
    indices: tuple[int, ...]
    timestamps: tuple[float, ...]
    fps: float
    duration: float


@dataclass(frozen=True)
class ToolResult:
    """The outcome of one call, in the call's position within its turn.

    Exactly one of `frames` (a crop or another tool's clip), `text` (a tool's text answer) or
    `error` is set; `summary` is filled in sub-agent mode with the sub-agent's text; `window` is
    the clamped [start, end] actually cropped. `latency_s`: the call's run time (0 for a call
    that never reached its tool); `timed_out`: it ran past its tool's timeout.
    """

    index: int
    name: str
    frames: Frames | None = None
    window: tuple[float, float] | None = None
    error: str | None = None
    summary: str | None = None
    text: str | None = None
    latency_s: float = 0.0
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and (self.frames is not None or self.text is not None)


@dataclass(frozen=True)
class Turn:
    """One main-agent round: the model's own text (forced prefix included) and what it caused."""

    text: str
    calls: tuple[ParsedCall, ...] = ()
    results: tuple[ToolResult, ...] = ()
    forced_answer: bool = False


@dataclass(frozen=True)
class Visual:
    """Processor outputs for one visual segment (a video clip) of a token sequence.

    Tensors are kept as produced by the Qwen-VL processor: `pixel_values_videos`
    [patches, C*tp*p*p] and `video_grid_thw` [1, 3]; `second_per_grid_ts` for Qwen2.5-VL.
    `frames` are the decoded frames they came from (engines that run their own processor, vLLM).
    """

    pixel_values_videos: Any  # torch.Tensor
    video_grid_thw: Any  # torch.Tensor [1, 3]
    second_per_grid_ts: float | None = None
    frames: Frames | None = None


@dataclass(frozen=True)
class Trajectory:
    """A complete, token-exact rollout of the main agent (or of one sub-agent).

    `token_ids`, `loss_mask` and `logprobs` are aligned, length T (prompt included). `logprobs[t]`
    is the behaviour policy's log-probability of `token_ids[t]` under the sampling distribution
    (logits / temperature with vision placeholders suppressed) where `loss_mask[t] == 1`, else 0.
    `visuals` are every video segment of the sequence in order, so one forward pass over
    `token_ids` with them reproduces `logprobs`. `versions[t]` is the policy version (optimiser
    updates) of the engine weights when token t was appended: for a trained token, the policy
    that sampled it, which partial rollouts (`rollout.partial`) let change between turns;
    () when not recorded (hand-built trajectories).
    """

    sample_id: str
    group_index: int
    token_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    visuals: tuple[Visual, ...]
    prompt_length: int
    turns: tuple[Turn, ...] = ()
    num_calls: int = 0
    num_valid_calls: int = 0
    num_tool_responses: int = 0
    num_rounds: int = 0
    truncated: bool = False
    finish_reason: str = "stop"
    frame_budget: int = 0
    sub_trajectories: tuple[Trajectory, ...] = ()
    versions: tuple[int, ...] = ()  # last: added after the others, positional callers keep working
    # the reward an agent program posted for its episode (paravt.gateway); None: it posted none
    agent_reward: float | None = None
    # histories the agent program changed, each starting a new trajectory of its episode
    # (paravt.gateway, logged as gateway/forks); None: not played through the gateway
    forks: int | None = None

    @property
    def response_text(self) -> str:
        """The model's own text over all turns (forced prefixes included), joined by newlines."""
        return "\n".join(turn.text for turn in self.turns)

    @property
    def num_trained_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclass(frozen=True)
class RewardBreakdown:
    """A scalar reward and its components, for logging."""

    total: float
    accuracy: float = 0.0
    format: float = 0.0
    tool: float = 0.0
    degenerate: bool = False
    components: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class AgentRun(Sequence):
    """What one `AgentLoop.run` produced and measured: the N trajectories (group-major; the
    object is a sequence of them), the samples whose video failed (id -> error text, which names
    the file) and seconds per phase (prompt, generate, tools, subagent)."""

    trajectories: tuple[Trajectory, ...]
    video_errors: Mapping[str, str] = field(default_factory=dict)
    timings: Mapping[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.trajectories)

    def __getitem__(self, index):
        return self.trajectories[index]

    def __iter__(self) -> Iterator[Trajectory]:
        return iter(self.trajectories)
