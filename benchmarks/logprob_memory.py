"""Peak host memory of the trainer's log-prob + entropy pass (forward and backward) at Qwen's
vocabulary (151,936), full logits vs the chunked lm_head, side by side.

Each configuration runs in a subprocess of its own: hidden states [1, T, H] and an lm_head
[V, H] are made, the process's resident set (VmRSS) is read, then one forward of log-probs and
entropy and one backward of a loss over them run; the high-water mark (VmHWM) minus that
baseline is the pass's working set. tracemalloc does not see torch's allocations and torch keeps
no CPU allocator statistics, hence RSS.

- `full`: what the trainer did before (paravt 0.x): the lm_head's full logits [T, V], then
  `token_logprobs` (chunked over T but every fp32 chunk kept for backward) and a second
  full-vocabulary pass for the entropy (`entropy_from_logits`, no grad).
- `chunked`: `paravt.rl.fused_logprobs.linear_logprobs(..., entropy=True)`: logits recomputed
  chunk by chunk in backward, entropy in the same pass.

The vocabulary-sized tensors dominate, so H is small by default (64) to keep CPU time low; the
full path grows as T x V, the chunked one stays at a few [chunk, V] fp32 buffers. Configurations
of `full` above `--full-max-tokens` are not run (they would take T x V x 12 bytes) and are
printed as skipped. Linux only (/proc/self/status).

    python benchmarks/logprob_memory.py [--tokens 2048 8192 16384] [--hidden 64] [--chunk 1024]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

VOCAB = 151_936


def _status_mib(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def _child(path: str, tokens: int, hidden: int, chunk: int, vocab: int) -> dict:
    import torch

    from paravt.rl.fused_logprobs import linear_logprobs
    from paravt.rl.logprobs import token_logprobs
    from paravt.rl.losses import entropy_from_logits

    torch.manual_seed(0)
    h = torch.randn(1, tokens, hidden, requires_grad=True)
    w = (torch.randn(vocab, hidden) * 0.05).requires_grad_()
    targets = torch.randint(0, vocab, (1, tokens))
    suppress = [151652, 151653, 151655, 151656][: 4 if vocab > 151656 else 0]
    base = _status_mib("VmRSS")
    start = time.perf_counter()
    if path == "full":
        logits = h @ w.t()  # [1, T, V]
        logp = token_logprobs(logits, targets, 1.0, suppress, chunk)
        with torch.no_grad():
            ent = entropy_from_logits(logits.detach(), chunk)
    else:
        logp, ent = linear_logprobs(h, w, targets, 1.0, suppress, chunk, entropy=True)
    (logp.sum() + 0.0 * ent.sum()).backward()
    seconds = time.perf_counter() - start
    return {
        "path": path,
        "tokens": tokens,
        "baseline_mib": round(base, 1),
        "peak_mib": round(_status_mib("VmHWM") - base, 1),
        "seconds": round(seconds, 2),
        "grad_norm": float(w.grad.norm()),
    }


def _run(path: str, tokens: int, args) -> dict:
    cmd = [sys.executable, __file__, "--child", path, str(tokens)]
    cmd += ["--hidden", str(args.hidden), "--chunk", str(args.chunk), "--vocab", str(args.vocab)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{path} at {tokens} tokens failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192, 16384])
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--chunk", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=VOCAB)
    p.add_argument("--full-max-tokens", type=int, default=2048)
    p.add_argument("--child", nargs=2, metavar=("PATH", "TOKENS"))
    args = p.parse_args()
    if args.child:
        path, tokens = args.child[0], int(args.child[1])
        print(json.dumps(_child(path, tokens, args.hidden, args.chunk, args.vocab)))
        return
    buffer_mib = args.chunk * args.vocab * 4 / 2**20
    print(
        f"vocab {args.vocab}, hidden {args.hidden}, chunk {args.chunk} tokens "
        f"(one [chunk, V] fp32 buffer = {buffer_mib:.0f} MiB); log-probs + entropy, fwd + bwd"
    )
    print(
        f"{'tokens':>7} | {'full MiB':>9} {'s':>6} | {'chunked MiB':>11} {'s':>6} | "
        f"{'chunked / buffer':>16} | ratio"
    )
    for t in args.tokens:
        chunked = _run("chunked", t, args)
        if t <= args.full_max_tokens:
            full = _run("full", t, args)
            rel = abs(full["grad_norm"] - chunked["grad_norm"]) / full["grad_norm"]
            assert rel < 1e-4, f"the two paths disagree on the gradient at {t} tokens: {rel}"
            cells = f"{full['peak_mib']:>9.0f} {full['seconds']:>6.1f}"
            ratio = f"{full['peak_mib'] / chunked['peak_mib']:.1f}x"
        else:
            est = t * args.vocab * 12 / 2**20
            cells, ratio = f"{'skipped':>9} {'':>6}", f"(full >= {est / 1024:.0f} GiB)"
        print(
            f"{t:>7} | {cells} | {chunked['peak_mib']:>11.0f} {chunked['seconds']:>6.1f} | "
            f"{chunked['peak_mib'] / buffer_mib:>16.2f} | {ratio}",
            flush=True,
        )


if __name__ == "__main__":
    main()
