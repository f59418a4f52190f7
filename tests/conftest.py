"""Shared fixtures: tiny checkpoints built once per test session (nothing is downloaded), a
guard: a test that writes into the repository's own `runs/` or `artifacts/` fails, and the
order of the test files: the slowest first."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from paravt.models.tiny import TinyModelConfig, build_tiny_model

ROOT = Path(__file__).resolve().parents[1]
# The slowest test files, slowest first, with the seconds each took (`pytest --durations`).
# `make test` gives each xdist worker whole files (--dist loadfile) in collection order
# (--no-loadscope-reorder): these go first, so that no long file starts last and leaves the
# other core idle until it ends. A stale entry only costs balance; a missing file fails
# tests/test_slowest_files.py.
SLOWEST_FILES = Path(__file__).with_name("slowest_files.txt")


def _share_the_cores() -> None:
    """Each xdist worker's torch gets its share of the cores (2 cores, 2 workers: 1 thread).

    torch's OpenMP pool defaults to one thread per core in every process, so two workers run 4
    threads on 2 cores; an OpenMP team waits at each barrier for its descheduled thread: with
    other work on a 2-core machine, a training step of the tiny model ran 3-7x slower than with
    one thread per worker (measured side by side). The subprocesses the tests start already get
    OMP_NUM_THREADS=1 (`run_script`); the environment variable set here covers the rest."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers < 2:
        return
    import torch

    threads = max(1, len(os.sched_getaffinity(0)) // workers)
    torch.set_num_threads(threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))


_share_the_cores()


def slowest_files() -> list[str]:
    """The paths (from the repository root) listed in `SLOWEST_FILES`, in its order."""
    lines = SLOWEST_FILES.read_text().splitlines()
    return [line.split()[1] for line in lines if line.strip() and not line.startswith("#")]


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(slowest_files())}

    def place(item) -> int:
        return rank.get(item.nodeid.split("::")[0], len(rank))  # the file, as xdist splits it

    items.sort(key=place)  # stable: every file keeps its tests' order, the rest their order


def run_script(
    *args: str,
    script: str = "train.py",
    cwd: Path = ROOT,
    timeout: float = 600,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """`python <script> *args` as a user runs it: a subprocess with this checkout first on the
    path, one OMP thread, Hydra's short errors (HYDRA_FULL_ERROR unset unless `env` sets it);
    stdout and stderr captured as text."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    full.pop("HYDRA_FULL_ERROR", None)
    full |= env or {}
    cmd = [sys.executable, str(ROOT / script), *args]
    return subprocess.run(cmd, cwd=cwd, env=full, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def train_py():
    """`run_script`: the one way the tests start `train.py` / `evaluate.py` as subprocesses."""
    return run_script


GUARDED = ("runs", "artifacts")  # what train.py / evaluate.py write by default


def _tree_state(depth: int = 3) -> dict[str, int]:
    """Path -> mtime of every entry of the guarded folders down to `depth` levels (a new file
    deeper down changes its folder's mtime at some level here)."""
    state: dict[str, int] = {}
    for name in GUARDED:
        top = ROOT / name
        if not top.exists():
            continue
        state[name] = top.stat().st_mtime_ns
        for folder, dirs, files in os.walk(top):
            level = len(Path(folder).relative_to(top).parts)
            if level >= depth:
                dirs.clear()
            for entry in (*dirs, *files):
                path = Path(folder) / entry
                with contextlib.suppress(FileNotFoundError):
                    state[str(path.relative_to(ROOT))] = path.lstat().st_mtime_ns
    return state


@pytest.fixture(autouse=True)
def _writes_nothing_into_the_repository(request):
    """Tests write under their tmp folders only: pass `hydra.run.dir` / `out_dir` / `cwd`.
    PARAVT_TEST_ROOT_WRITES=allow turns the check off (a demo running in this checkout)."""
    if os.environ.get("PARAVT_TEST_ROOT_WRITES") == "allow":
        yield
        return
    before = _tree_state()
    yield
    after = _tree_state()
    changed = sorted(k for k in after.keys() | before.keys() if after.get(k) != before.get(k))
    if changed:
        pytest.fail(
            f"{request.node.nodeid} wrote into the repository: {changed[:8]}; give the run a "
            "tmp folder (hydra.run.dir=..., out_dir=..., or cwd=tmp_path)",
            pytrace=False,
        )


def built_once(tmp_path_factory, name: str, build: Callable[[Path], object]) -> Path:
    """A folder `build(folder)` fills, built once per test run: under pytest-xdist the first
    worker to need it builds it in the run's shared temporary folder (under a file lock) and the
    others use that one (the real-vocabulary tiny models take tens of seconds each)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        out = tmp_path_factory.mktemp(name)
        build(out)
        return out
    from filelock import FileLock

    out = tmp_path_factory.getbasetemp().parent / name  # this run's, all workers'
    done = out / ".built"
    with FileLock(str(out) + ".lock"):
        if not done.is_file():
            shutil.rmtree(out, ignore_errors=True)  # a build cut short
            out.mkdir()
            build(out)
            done.touch()
    return out


def _tiny(tmp_path_factory, name: str, cfg: TinyModelConfig) -> Path:
    import torch

    out = built_once(tmp_path_factory, name, lambda folder: build_tiny_model(folder, cfg))
    torch.manual_seed(cfg.seed)  # as a build leaves it, whichever worker built the folder
    return out


@pytest.fixture
def own_vllm_engines():
    """For a test that starts in-process vLLM engines of its own, directly or through a run:
    vLLM's parallel state is process-wide (paravt/rollout/engines/vllm.py), so the worker's shared
    engine (tests/rollout/conftest.py), if open, is closed first (the next module that needs it
    starts it again), and the test's are closed at its end, not whenever the garbage collector
    finds them, in the middle of another module's engine's life."""
    from paravt.rollout.engines.vllm import close_engines

    close_engines()
    yield
    close_engines()


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory):
    return _tiny(tmp_path_factory, "tiny_qwen3_vl", TinyModelConfig("qwen3_vl"))


@pytest.fixture(scope="session")
def tiny_qwen25_dir(tmp_path_factory):
    return _tiny(tmp_path_factory, "tiny_qwen2_5_vl", TinyModelConfig("qwen2_5_vl"))


@pytest.fixture(scope="session")
def tiny_qwen3_real_vocab_dir(tmp_path_factory):
    """The tiny Qwen3-VL with Qwen's real vocabulary and official chat template."""
    cfg = TinyModelConfig("qwen3_vl", tokenizer="qwen")
    return _tiny(tmp_path_factory, "tiny_qwen3_vl_qwen", cfg)


@pytest.fixture(scope="session")
def tiny_qwen25_real_vocab_dir(tmp_path_factory):
    """The tiny Qwen2.5-VL with Qwen's real vocabulary and official chat template."""
    cfg = TinyModelConfig("qwen2_5_vl", tokenizer="qwen")
    return _tiny(tmp_path_factory, "tiny_qwen2_5_vl_qwen", cfg)


@pytest.fixture(scope="module")
def lora_policy(tiny_qwen3_dir):
    """The tiny Qwen3-VL with rank-4 adapters (alpha 32: scale 8), B random; one per module."""
    import torch

    from paravt.models.loading import PolicySpec, load_policy
    from paravt.models.lora import lora_layers

    policy, processor = load_policy(PolicySpec(path=str(tiny_qwen3_dir), lora={"rank": 4}))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # B starts at 0: random adapters make the merge visible
        for layer in lora_layers(policy).values():
            b = layer.lora_B["default"].weight
            b.copy_(torch.randn(b.shape, generator=g))
    return policy, processor


@pytest.fixture(scope="session")
def needle_dir(tmp_path_factory):
    from paravt.video.synthetic import NeedleConfig, generate

    cfg = NeedleConfig(num_train=4, num_eval=2, seed=3)
    return built_once(tmp_path_factory, "needle", lambda out: generate(cfg, out))


@pytest.fixture(scope="session")
def tiny_run_overrides(tiny_qwen3_dir, needle_dir) -> list[str]:
    """`train.py` overrides for a subprocess run on the test run's tiny model and needle data,
    one prompt x 2 rollouts a step (the tests add their own steps, sweeps and caps)."""
    return [
        f"model.path={tiny_qwen3_dir}",
        "model.build_tiny=null",
        f"data.train_path={needle_dir / 'train.jsonl'}",
        f"data.eval_path={needle_dir / 'eval.jsonl'}",
        "data.generate=null",
        "data.batch_size=1",
        "rollout.group_size=2",
    ]


@pytest.fixture(scope="session")
def needle_samples(needle_dir):
    from paravt.data.datasets import load_samples

    samples, report = load_samples(needle_dir / "train.jsonl")
    assert report.kept == 4, report
    return samples


@pytest.fixture(scope="session")
def sft_file(tmp_path_factory, tiny_qwen3_dir, needle_samples):
    """The needle teacher's trajectories of `needle_samples` in the ParaVT SFT schema (jsonl)."""
    from transformers import AutoProcessor

    from paravt.agent.loop import AgentConfig
    from paravt.data.sft_writer import teacher_rows, write_rows

    processor = AutoProcessor.from_pretrained(tiny_qwen3_dir)
    rows = teacher_rows(needle_samples, processor, AgentConfig(max_rounds=2))
    return write_rows(rows, tmp_path_factory.mktemp("sft") / "train.jsonl")


@pytest.fixture(scope="session")
def tool_caller(tiny_qwen3_dir, needle_samples, tmp_path_factory):
    """A tiny Qwen3-VL overfitted for a few seconds to call crop_video in parallel and answer.

    Built by driving the real agent loop with the scripted teacher (real crops, real tool-response
    tokens), then a few supervised steps on those trajectories. Returns (model, processor).
    Under pytest-xdist the first worker to need it builds it and saves it in the run's shared
    temporary folder; the others load that checkpoint (the same weights, built once per run).
    """
    from transformers import AutoModelForImageTextToText, AutoProcessor

    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return _build_tool_caller(tiny_qwen3_dir, needle_samples)
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent / "tool_caller"  # this run's, all workers'
    state = shared / "module_state.json"  # what a checkpoint does not keep
    with FileLock(str(shared) + ".lock"):
        if not state.is_file():
            model, processor = _build_tool_caller(tiny_qwen3_dir, needle_samples)
            model.save_pretrained(shared)
            processor.save_pretrained(shared)
            frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
            state.write_text(json.dumps({"training": model.training, "frozen": frozen}))
            return model, processor
    saved = json.loads(state.read_text())
    model = AutoModelForImageTextToText.from_pretrained(shared).train(saved["training"])
    for name, param in model.named_parameters():
        param.requires_grad_(name not in saved["frozen"])
    return model, AutoProcessor.from_pretrained(shared)


def _build_tool_caller(tiny_qwen3_dir, needle_samples):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from paravt.agent.loop import AgentConfig, AgentLoop
    from paravt.agent.render import ChatRenderer
    from paravt.agent.scripts import needle_teacher
    from paravt.modules.sft import supervised_steps
    from paravt.rollout.engine import SamplingParams
    from paravt.rollout.engines.scripted import ScriptedEngine
    from paravt.video.reader import VideoReader

    torch_seed = 0
    processor = AutoProcessor.from_pretrained(tiny_qwen3_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_qwen3_dir)
    teacher = ScriptedEngine(processor.tokenizer, needle_teacher(needle_samples, "search"))
    loop = AgentLoop(teacher, ChatRenderer(processor), VideoReader(), AgentConfig(max_rounds=2))
    trajs = loop.run(needle_samples, [4] * len(needle_samples), 1, SamplingParams(greedy=True))
    assert all(t.num_valid_calls >= 1 for t in trajs)
    import torch

    torch.manual_seed(torch_seed)
    # One batch = the 4 trajectories: batches cycle over them, so the default batch of 8 held
    # each twice, for the same token-mean loss and gradient (over 6 steps the losses and
    # weights agreed to 1.2e-6, in a third of the time).
    losses = supervised_steps(model, processor, trajs, 80, batch_size=len(trajs))
    assert losses[-1] < 0.1 * losses[0], losses[::10]
    return model, processor
