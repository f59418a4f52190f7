"""The trainer-side pieces of the `vllm_server` engine, without vLLM: the weight-sync plan, the
checkpoint check, routing across servers, the wire format. The servers themselves are tested
for real in tests/rollout/serving/test_vllm_server.py (marker `vllm`)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

from paravt.rollout.engine import GenerationOutput, GenerationRequest, SamplingParams
from paravt.rollout.serving.checkpoint import (
    CheckpointError,
    check_checkpoint,
    model_manifest,
    read_headers,
    write_checkpoint,
)
from paravt.rollout.serving.protocol import (
    SYNC_PLAN,
    SyncPlanError,
    check_sync_plan,
    decode_output,
    decode_params,
    decode_request,
    encode_output,
    encode_params,
    encode_request,
)
from paravt.rollout.serving.routing import Router, group_key
from paravt.types import Frames, Visual

RESETS = ("reset_prefix_cache", "reset_encoder_cache", "reset_mm_cache")


# ---- the sync plan ----------------------------------------------------------------------------
def test_the_plan_is_pause_load_three_resets_version_resume():
    check_sync_plan(SYNC_PLAN)
    assert SYNC_PLAN.index("pause") == 0 and SYNC_PLAN[-1] == "resume"
    load, version = SYNC_PLAN.index("load"), SYNC_PLAN.index("set_version")
    assert all(load < SYNC_PLAN.index(r) < version for r in RESETS)


@pytest.mark.parametrize("reset", RESETS)
def test_a_plan_without_a_cache_reset_is_refused_naming_it(reset):
    plan = [s for s in SYNC_PLAN if s != reset]
    with pytest.raises(SyncPlanError, match=f"lacks '{reset}'"):
        check_sync_plan(plan)


def test_a_reset_before_the_load_is_refused():
    plan = list(SYNC_PLAN)
    plan.remove("reset_prefix_cache")
    plan.insert(1, "reset_prefix_cache")  # reset, then load: the load refills the cache
    with pytest.raises(SyncPlanError, match="runs 'reset_prefix_cache' where 'load' belongs"):
        check_sync_plan(plan)


def test_an_unknown_step_is_refused():
    with pytest.raises(SyncPlanError, match="unknown step"):
        check_sync_plan([*SYNC_PLAN, "reset_everything"])


# ---- the checkpoint check ---------------------------------------------------------------------
class Tiny(torch.nn.Module):
    def __init__(self, width: int = 3):
        super().__init__()
        self.a = torch.nn.Linear(2, width)
        self.b = torch.nn.Linear(width, 2, bias=False)


def test_a_written_checkpoint_is_the_models_and_passes(tmp_path):
    model = Tiny()
    folder = write_checkpoint(model, tmp_path / "v1", torch.float32, bucket_bytes=16)
    assert len(list(folder.glob("*.safetensors"))) >= 2  # bucketed into several files
    assert read_headers(folder) == {"a.weight": (3, 2), "a.bias": (3,), "b.weight": (2, 3)}
    check_checkpoint(folder, model_manifest(model))


def test_a_partial_checkpoint_is_refused(tmp_path):
    model = Tiny()
    folder = write_checkpoint(model, tmp_path / "v1", torch.float32, bucket_bytes=1)
    last = sorted(folder.glob("*.safetensors"))[-1]
    last.unlink()  # one bucket's file never written
    with pytest.raises(CheckpointError, match=r"partial checkpoint, 1 of the model's 3 tensors"):
        check_checkpoint(folder, model_manifest(model))


def test_a_checkpoint_of_another_shape_is_refused(tmp_path):
    folder = write_checkpoint(Tiny(width=4), tmp_path / "v1", torch.float32)
    with pytest.raises(
        CheckpointError,
        match=r"3 tensor\(s\) of another shape \(e.g. a.bias: \[4\], the model's is \[3\]",
    ):
        check_checkpoint(folder, model_manifest(Tiny(width=3)))


def test_a_checkpoint_with_foreign_tensors_is_refused(tmp_path):
    folder = write_checkpoint(Tiny(), tmp_path / "v1", torch.float32)
    manifest = {k: v for k, v in model_manifest(Tiny()).items() if k != "a.bias"}
    with pytest.raises(CheckpointError, match=r"tensor\(s\) the model does not have.*a.bias"):
        check_checkpoint(folder, manifest)


def test_a_truncated_file_is_refused(tmp_path):
    model = Tiny()
    folder = write_checkpoint(model, tmp_path / "v1", torch.float32)
    (part,) = folder.glob("*.safetensors")
    data = part.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    part.write_bytes(data[: 8 + n + 4])  # the header whole, the data cut off
    with pytest.raises(CheckpointError, match="truncated"):
        check_checkpoint(folder, model_manifest(model))


def test_a_failed_write_still_runs_the_gather_to_the_end(tmp_path, monkeypatch):
    """Under FSDP2 the gather is a collective: rank 0 must not leave it when its write fails
    (its peers would wait in it for ever), nor a rank that writes nothing (folder None)."""
    from paravt.rollout.serving import checkpoint as server_checkpoint

    real, taken = server_checkpoint._policy_buckets, []

    def counted(policy, bucket_bytes, *args):
        for bucket in real(policy, bucket_bytes, *args):
            taken.append(len(bucket))
            yield bucket

    monkeypatch.setattr(server_checkpoint, "_policy_buckets", counted)
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with pytest.raises(OSError):
        write_checkpoint(Tiny(), blocker / "v1", torch.float32, bucket_bytes=1)
    assert len(taken) == len(Tiny().state_dict())  # every bucket was gathered
    taken.clear()
    assert write_checkpoint(Tiny(), None, torch.float32, bucket_bytes=1) is None
    assert len(taken) == len(Tiny().state_dict())


def test_an_empty_folder_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors"):
        check_checkpoint(tmp_path, {"a": (1,)})


# ---- routing ----------------------------------------------------------------------------------
def _req(name: str, n: int = 10, start: int = 0) -> GenerationRequest:
    return GenerationRequest(tuple(range(start, start + n)), (), name)


def test_groups_stay_whole_and_spread_over_servers():
    router = Router(["A", "B"])
    reqs = [_req(f"trajectory s{s}#{g}") for s in range(4) for g in range(3)]
    homes = router.assign(reqs, new_tokens=5)
    by_group = {}
    for req, url in zip(reqs, homes, strict=True):
        by_group.setdefault(group_key(req.name), set()).add(url)
    assert all(len(urls) == 1 for urls in by_group.values())  # a group on one server
    assert [next(iter(by_group[f"trajectory s{s}"])) for s in range(4)] == ["A", "B", "A", "B"]


def test_a_trajectorys_next_turn_goes_to_its_server_even_when_that_one_is_busier():
    router = Router(["A", "B"])
    first = router.assign([_req("t x#0"), _req("t y#0")], new_tokens=5)
    assert first == ["A", "B"]
    router.start("B", 1000)  # B busy: new work would go to A
    longer = GenerationRequest((*range(10), 99, 98), (), "t y#0")  # y's context + its turn
    assert router.assign([longer, _req("t z#0")], new_tokens=5) == ["B", "A"]


def test_a_new_trajectory_under_a_known_name_is_placed_afresh():
    router = Router(["A", "B"])
    assert router.assign([_req("t x#0")], 5) == ["A"]
    router.start("A", 1000)
    # the same name next epoch: another context (not a continuation), so least work wins
    assert router.assign([_req("t x#0", start=50)], 5) == ["B"]


def test_least_work_in_flight_counts_tokens_and_finishes():
    router = Router(["A", "B", "C"])
    router.start("A", 30)
    router.start("B", 10)
    assert router.least_loaded() == "C"
    router.start("C", 20)
    assert router.least_loaded() == "B"
    router.finish("A", 30)
    assert router.least_loaded() == "A"


def test_unnamed_requests_are_spread_one_by_one():
    router = Router(["A", "B"])
    assert router.assign([_req(""), _req(""), _req("")], 5) == ["A", "B", "A"]


def test_each_trainer_rank_breaks_ties_from_its_own_server():
    """Ranks count only their own work: with one group each, rank r must start on server
    r mod M, or every rank's group would land on the first server."""
    homes = [Router(["A", "B", "C"], first=r).assign([_req(f"t s{r}#0")], 5) for r in range(4)]
    assert homes == [["A"], ["B"], ["C"], ["A"]]
    spread = Router(["A", "B"], first=1).assign([_req(f"t s{s}#0") for s in range(3)], 5)
    assert spread == ["B", "A", "B"]


def test_a_failed_server_forgets_its_trajectories():
    router = Router(["A", "B"])
    router.assign([_req("t x#0"), _req("t y#0")], 5)
    router.forget("A")
    assert set(router.home) == {"t y#0"}


# ---- the wire format --------------------------------------------------------------------------
def test_requests_params_and_outputs_round_trip_exactly():
    pixels = np.random.default_rng(0).integers(0, 256, (2, 8, 6, 3), dtype=np.uint8)
    frames = Frames(pixels, (4, 9), (2.0, 4.5), 2.0, 12.25)
    req = GenerationRequest((1, 2, 3), (Visual(None, None, frames=frames),), "t s#1", 2**62 + 7)
    back = decode_request(encode_request(req))
    assert back.seed == 2**62 + 7 and back.token_ids == req.token_ids and back.name == req.name
    assert decode_request(encode_request(GenerationRequest((1,)))).seed is None
    got = back.visuals[0].frames
    assert np.array_equal(got.pixels, pixels) and got.indices == (4, 9)
    assert (got.timestamps, got.fps, got.duration) == ((2.0, 4.5), 2.0, 12.25)
    params = SamplingParams(max_new_tokens=9, temperature=0.7, n=2, seed=3)
    assert decode_params(encode_params(params)) == params
    out = GenerationOutput((5, 6), (-0.1234567890123, -2.5e-9), "stop")
    import json

    assert decode_output(json.loads(json.dumps(encode_output(out)))) == out  # floats exact


def test_a_clip_without_frames_is_refused_naming_the_request():
    req = GenerationRequest((1,), (Visual(None, None, frames=None),), "trajectory s3#0")
    with pytest.raises(ValueError, match="trajectory s3#0: clip 0 has no decoded frames"):
        encode_request(req)


# ---- the servers' interpreter -----------------------------------------------------------------
def test_a_missing_server_interpreter_is_refused(tmp_path):
    from paravt.errors import UserError
    from paravt.rollout.serving.launch import server_python

    with pytest.raises(UserError, match=r"server_python=.*does not exist"):
        server_python(str(tmp_path / "python"))


@pytest.mark.skipif(
    __import__("importlib.util").util.find_spec("vllm") is not None, reason="vLLM is here"
)
def test_an_interpreter_without_vllm_is_refused_naming_the_fix():
    import sys

    from paravt.errors import UserError
    from paravt.rollout.serving.launch import server_python

    with pytest.raises(UserError, match=r"has no vLLM: set rollout.engine.server_python"):
        server_python(sys.executable)


def test_started_servers_get_their_tensor_parallel_share_of_devices():
    from paravt.rollout.engine import EngineConfig

    cfg = EngineConfig(
        name="vllm_server", num_servers=2, tensor_parallel_size=2, devices=[4, 5, 6, "7"]
    )
    assert [cfg.server_gpus(0), cfg.server_gpus(1)] == [(4, 5), (6, 7)]
    assert EngineConfig(name="vllm_server").server_gpus(0) is None  # empty: inherit
    with pytest.raises(
        ValueError, match=r"names 1 GPU\(s\) for num_servers=2 x tensor_parallel_size=1"
    ):
        EngineConfig(name="vllm_server", num_servers=2, devices=[7])


def test_servers_are_not_started_by_a_launched_process_before_its_group_exists(monkeypatch):
    """Rank 0 of the live process group starts the servers for every rank; a process of a
    multi-process launch without its group cannot tell whether it is rank 0."""
    from paravt.errors import UserError
    from paravt.rollout.factory import check_one_host, check_one_launch

    monkeypatch.setenv("WORLD_SIZE", "1")
    check_one_launch()
    check_one_host()  # one process: nothing to compare
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UserError, match=r"process group is not initialised.*server_urls"):
        check_one_launch()
