"""Side-by-side: the RL update's forward + backward, right-padded micro-batches vs packed rows.

One step's trajectories have lengths drawn log-uniformly from the paper's spread (an answer
without tools ~1.5k tokens to three rounds of five crops ~16k), scaled down by `--scale` for the
tiny Qwen3-VL, in generation order. Both sides run the micro-batches the trainer would cut with
the same `algorithm.micro_batch_tokens` (padded: rows x longest; packed: tokens in all) and the
same loss (advantage-weighted masked log-prob sum) and backward; the padded and packed losses
and gradients are checked equal before timing. The packed rows attend per trajectory with no
dense mask (`paravt.models.varlen_attention`), and both sides score only the trained tokens
through the lm_head, as the trainer runs them; the two sides are timed in turns. Text-only
trajectories (the update's cost is per token; the vision tower is frozen and runs the same on
both sides).

`--sweep` also times both sides at 2x and 4x the budget: a padded micro-batch pads every row to
its longest, so a larger budget costs the padded side padding while the packed side gets fewer,
fuller micro-batches; the last line is always at `--budget`.

    python benchmarks/packed_update.py [--trajectories 16] [--scale 16] [--repeats 3] [--sweep]
"""

from __future__ import annotations

import argparse
import functools
import math
import random
import statistics
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from paravt.data.packing import model_rope_index
from paravt.models.forward import TokenIds, trajectory_logprobs
from paravt.models.tiny import TinyModelConfig, build_tiny_model
from paravt.models.varlen_attention import VARLEN, varlen_attention
from paravt.modules.packed_forward import packed_chunks, packed_trajectory_logprobs
from paravt.rl.microbatch import token_budget_chunks
from paravt.types import Trajectory


def step_trajectories(n: int, scale: int, words: list[int], seed: int) -> list[Trajectory]:
    """`n` text trajectories of `words`, lengths log-uniform in [1.5k, 16k] / scale, the last
    60% trained."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = int(math.exp(rng.uniform(math.log(1536), math.log(16384))) / scale)
        ids = tuple(rng.choice(words) for _ in range(length))
        prompt = int(length * 0.4)
        mask = (0,) * prompt + (1,) * (length - prompt)
        out.append(Trajectory(f"s{i}", i % 8, ids, mask, (0.0,) * length, (), prompt))
    return out


def update(model, trajs, chunks, ids: TokenIds, packed: bool) -> tuple[float, list[torch.Tensor]]:
    """Forward + backward over every micro-batch; (the summed loss, the accumulated gradients)."""
    rope = model_rope_index(model)
    with varlen_attention(model) if packed else nullcontext():
        total = sum(micro_step(model, trajs, chunk, ids, rope, packed) for chunk in chunks)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return total, grads


def micro_step(model, trajs, chunk, ids: TokenIds, rope, packed: bool) -> float:
    """One micro-batch's forward + backward; its loss."""
    rows = [trajs[i] for i in chunk]
    if packed:
        logp, batch, _ = packed_trajectory_logprobs(model, rows, ids, rope, only_trained=True)
    else:
        logp, batch, _ = trajectory_logprobs(model, rows, ids, only_trained=True)
    adv = torch.tensor([(i % 5 - 2) / 2 for i in chunk]).unsqueeze(1)  # per trajectory
    loss = -torch.where(batch.loss_mask, logp * adv, torch.zeros_like(logp)).sum() / 1e3
    loss.backward()
    return float(loss.detach())


def timed_side_by_side(fns, repeats: int) -> list[float]:
    """Median seconds of each of `fns`, run in turns (a, b, a, b, ...) after one warm-up each,
    so a change in the machine's load falls on both sides alike."""
    times: list[list[float]] = [[] for _ in fns]
    for fn in fns:
        fn()  # warm-up
    for _ in range(repeats):
        for fn, out in zip(fns, times, strict=True):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def checked_chunks(model, trajs, ids: TokenIds, budget: int) -> tuple[list, list]:
    """(padded chunks, packed chunks) at `budget` tokens per micro-batch, after checking that
    both sides give the same loss and gradients."""
    lengths = [len(t.token_ids) for t in trajs]
    padded_chunks = token_budget_chunks(lengths, budget)
    pack_chunks = packed_chunks(lengths, budget)
    (loss_pad, g_pad), (loss_pack, g_pack) = (
        update(model, trajs, padded_chunks, ids, False),
        update(model, trajs, pack_chunks, ids, True),
    )
    if not math.isclose(loss_pad, loss_pack, rel_tol=1e-4):
        raise SystemExit(f"padded and packed losses differ: {loss_pad} vs {loss_pack}")
    worst = max(float((a - b).abs().max()) for a, b in zip(g_pad, g_pack, strict=True))
    if len(g_pad) != len(g_pack) or worst > 1e-5:
        raise SystemExit(f"padded and packed gradients differ (max abs difference {worst:.2e})")
    print(f"budget {budget} tokens: losses equal, gradients within {worst:.1e}")
    return padded_chunks, pack_chunks


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trajectories", type=int, default=16)
    p.add_argument("--scale", type=int, default=16, help="paper lengths / this = tiny lengths")
    p.add_argument("--budget", type=int, default=16384, help="micro_batch_tokens at paper scale")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sweep", action="store_true", help="also time 2x and 4x the budget")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_model(Path(tmp) / "model", TinyModelConfig("qwen3_vl"))
        processor = AutoProcessor.from_pretrained(path)
        model = AutoModelForImageTextToText.from_pretrained(path)
    ids = TokenIds.from_tokenizer(processor.tokenizer)
    special = set(processor.tokenizer.all_special_ids) | {ids.image, ids.video, *ids.suppress}
    words = [i for i in range(model.config.text_config.vocab_size) if i not in special]
    trajs = step_trajectories(args.trajectories, args.scale, words, args.seed)
    lengths = [len(t.token_ids) for t in trajs]
    print(
        f"trajectories: {len(trajs)}, lengths {min(lengths)}..{max(lengths)} (sum {sum(lengths)})"
    )
    print(f"threads: {torch.get_num_threads()}; packed attention: {VARLEN}")
    factors = (1, 2, 4) if args.sweep else (1,)
    budgets = [args.budget * f // args.scale for f in factors]  # tokens at the tiny scale
    chunks = [checked_chunks(model, trajs, ids, b) for b in budgets]
    # every configuration timed in the same turns, so the load falls on all of them alike
    times = timed_side_by_side(
        [
            functools.partial(update, model, trajs, c, ids, packed)
            for pair in chunks
            for c, packed in zip(pair, (False, True), strict=True)
        ],
        args.repeats,
    )
    rows = [(*pair, *times[2 * i : 2 * i + 2]) for i, pair in enumerate(chunks)]
    if args.sweep:
        for f, b, (_, _, t_pad, t_pack) in zip(factors, budgets, rows, strict=True):
            print(
                f"budget x{f} ({b} tokens): padded {t_pad:.3f} s, packed {t_pack:.3f} s, "
                f"{t_pad / t_pack:.2f}x"
            )
        best_pad, best_pack = min(r[2] for r in rows), min(r[3] for r in rows)
        print(f"each side at its best budget of these: {best_pad / best_pack:.2f}x")
    padded_chunks, pack_chunks, t_pad, t_pack = rows[0]
    padded_tokens = sum(len(c) * max(lengths[i] for i in c) for c in padded_chunks)
    print(f"micro-batch budget: {budgets[0]} tokens")
    print(f"padded: {len(padded_chunks)} micro-batches, {padded_tokens} tokens run, {t_pad:.3f} s")
    print(f"packed: {len(pack_chunks)} micro-batches, {sum(lengths)} tokens run, {t_pack:.3f} s")
    print(f"packed/padded update speed: {t_pad / t_pack:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
