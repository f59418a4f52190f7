"""Side-by-side: one paravt GRPO step vs. one TRL `GRPOTrainer` step, same tiny sizes, CPU.

Both sides: a Qwen3 text stack of the tiny model's sizes (hidden 64, 2 layers, 2 heads, vocab of
the tiny tokenizer), one prompt x 8 completions x <= 128 new tokens, sampled at temperature 1,
one AdamW step, no reference model (KL coefficient 0). paravt runs `train.py` (the tiny
Qwen3-VL, its needle prompt with a 4-frame overview clip, `max_rounds=0`: no tool turn) and
reports its `time/*` phases; TRL trains a `Qwen3ForCausalLM` of the same text sizes on a text
prompt of similar length. Each side runs `--steps` steps; the last step is compared (the first
carries one-off warm-up). TRL is a benchmark-only dependency (`benchmarks/requirements.txt`).

    python benchmarks/grpo_vs_trl.py [--steps 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from demo_phases import STEP_PHASES, time_scalars

ROOT = Path(__file__).resolve().parents[1]
GROUP, NEW_TOKENS = 8, 128


def paravt_step(tmp: Path, steps: int) -> dict[str, float]:
    run = tmp / "paravt"
    cmd = [
        sys.executable,
        "train.py",
        f"trainer.max_steps={steps}",
        "data.batch_size=1",
        f"rollout.group_size={GROUP}",
        "rollout.agent.max_rounds=0",
        f"rollout.agent.max_new_tokens={NEW_TOKENS}",
        "cold_start=null",
        "callbacks.benchmark_validation=null",
        "callbacks.rollout_logger=null",
        "export_hf=false",
        f"hydra.run.dir={run}",
    ]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return {k: v[-1] for k, v in time_scalars(run).items()}


def trl_step(tmp: Path, steps: int, prompt_tokens: int) -> float:
    from datasets import Dataset
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from paravt.models.tiny import TinyModelConfig, build_tiny_model

    tiny = TinyModelConfig()
    tok = AutoTokenizer.from_pretrained(build_tiny_model(tmp / "tiny", tiny))
    model = Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=len(tok),
            hidden_size=tiny.hidden_size,
            num_hidden_layers=tiny.num_layers,
            num_attention_heads=tiny.num_heads,
            num_key_value_heads=tiny.num_kv_heads,
            intermediate_size=tiny.intermediate_size,
            head_dim=tiny.hidden_size // tiny.num_heads,
            max_position_embeddings=tiny.max_position_embeddings,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        )
    )
    words = ("which colour appears first in the video answer with the letter " * 64).split()
    prompt = ""
    while len(tok(prompt)["input_ids"]) < prompt_tokens:
        prompt += words[len(prompt) % len(words)] + " "
    data = Dataset.from_dict({"prompt": [prompt] * GROUP * steps})

    def reward(completions, **_):  # any cheap reward: the cost under test is the step
        return [float(len(c) % 7) for c in completions]

    cfg = GRPOConfig(
        output_dir=str(tmp / "trl"),
        per_device_train_batch_size=GROUP,
        num_generations=GROUP,
        max_completion_length=NEW_TOKENS,
        max_steps=steps,
        learning_rate=1e-4,
        beta=0.0,
        temperature=1.0,
        use_cpu=True,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        bf16=False,
    )
    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            times.append(time.perf_counter())

        def on_step_end(self, *a, **k):
            times[-1] = time.perf_counter() - times[-1]

    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=cfg, train_dataset=data, processing_class=tok
    )
    trainer.add_callback(Clock())
    trainer.train()
    return times[-1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--prompt-tokens", type=int, default=200)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        ours = paravt_step(Path(tmp), args.steps)
        theirs = trl_step(Path(tmp), args.steps, args.prompt_tokens)
    step = sum(ours.get(k, 0.0) for k in STEP_PHASES)
    print(
        f"1 prompt x {GROUP} completions x <= {NEW_TOKENS} new tokens, tiny sizes, CPU; "
        f"step {args.steps} of {args.steps}"
    )
    print(f"{'':<26}{'s / step':>10}")
    print(f"{'TRL GRPOTrainer':<26}{theirs:>10.2f}")
    print(f"{'paravt (sum of phases)':<26}{step:>10.2f}")
    for k in STEP_PHASES:
        print(f"{'  ' + k:<26}{ours.get(k, 0.0):>10.2f}")
    print(f"TRL / paravt: {theirs / step:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
