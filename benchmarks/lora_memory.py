"""Memory of full-weight vs LoRA RL training state, measured side by side on one model.

For each mode, a fresh subprocess builds `GRPOModule` exactly as training does (policy, KL
reference, AdamW over the trainable parameters), runs one forward/backward/optimizer step on
random tokens, and reports the bytes of the tensors it holds: policy weights, reference weights
(a deep copy under full training; none under LoRA, where the reference is the policy with
adapters off), gradients and optimizer state, plus the process's peak RSS.

    python benchmarks/lora_memory.py [--hidden 512 --layers 8 --rank 16]

The model is a Qwen3-VL of the given size built locally with random weights (nothing is
downloaded). Bytes are counted from the tensors' storages (unique), so they do not depend on
what else runs on the machine; RSS does, a little.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path


def _bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def measure(path: str, rank: int, kl_coef: float) -> dict[str, float]:
    import torch

    from paravt.models.loading import PolicySpec
    from paravt.modules.grpo import GRPOModule
    from paravt.rewards.compose import RewardWeights
    from paravt.rl.algorithm import AlgorithmConfig

    lora = {"rank": rank, "alpha": 2.0 * rank} if rank else None
    module = GRPOModule(
        model=PolicySpec(path=path, lora=lora),
        algorithm=AlgorithmConfig(kl_coef=kl_coef),
        reward=RewardWeights(),
        optimizer=partial(torch.optim.AdamW, lr=1e-4),
    )
    opt = module.configure_optimizers()
    ids = torch.randint(0, 500, (2, 256))
    module.policy(input_ids=ids).logits.float().logsumexp(-1).mean().backward()
    opt.step()
    reference = module.reference
    ref_tensors = reference.parameters() if isinstance(reference, torch.nn.Module) else []
    states = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    out = {
        "policy": _bytes(module.policy.parameters()),
        "reference": _bytes(ref_tensors),
        "grads": _bytes(p.grad for p in module.policy.parameters()),
        "optimizer": _bytes(states),
        "trainable_params": sum(p.numel() for p in module.policy.parameters() if p.requires_grad),
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    out["state_total"] = out["policy"] + out["reference"] + out["grads"] + out["optimizer"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--kl-coef", type=float, default=0.01)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child[0], int(args.child[1]), args.kl_coef)))
        return
    from paravt.models.tiny import TinyModelConfig, build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        cfg = TinyModelConfig(
            hidden_size=args.hidden,
            num_layers=args.layers,
            num_heads=8,
            num_kv_heads=4,
            intermediate_size=4 * args.hidden,
        )
        build_tiny_model(Path(tmp), cfg)
        rows = {}
        for name, rank in (("full", 0), (f"lora r={args.rank}", args.rank)):
            cmd = [sys.executable, __file__, "--child", tmp, str(rank)]
            cmd += ["--kl-coef", str(args.kl_coef)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            rows[name] = json.loads(done.stdout.strip().splitlines()[-1])
    print(
        f"Qwen3-VL tiny, hidden {args.hidden}, {args.layers} layers, vocab 512; "
        f"kl_coef={args.kl_coef}; MiB"
    )
    keys = ("policy", "reference", "grads", "optimizer", "state_total", "peak_rss")
    print(f"{'mode':<12}" + "".join(f"{k:>12}" for k in keys) + f"{'trainable':>12}")
    for name, r in rows.items():
        cells = "".join(f"{r[k] / 2**20:12.1f}" for k in keys)
        print(f"{name:<12}{cells}{r['trainable_params']:>12,}")
    full, lora = rows["full"], rows[f"lora r={args.rank}"]
    print(
        f"LoRA / full: training state {lora['state_total'] / full['state_total']:.3f}, "
        f"peak RSS {lora['peak_rss'] / full['peak_rss']:.3f}"
    )


if __name__ == "__main__":
    main()
