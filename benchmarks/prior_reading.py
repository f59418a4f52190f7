"""Does the tool prior learn to see? Held-out answers before and after the prior stage.

Composes `experiment=demo_prior_<--arm> seed=<--seed>` (default paragrpo, seed 0) with
the given overrides, trains the tool prior alone (`paravt.run.prior.prior_stage`, no cache, no
cold start) and measures two things on the datamodule's first `--prompts` held-out samples:
- the answer tokens teacher-forced (`SFTModule.answer_metrics`: mean NLL and argmax accuracy)
  on held-out trajectories of four kinds, in the prior's dialect: `<tool_code>` searches at
  K = 2 and K = 16, oracle crops (around the needle) at K = 2, direct answers at K = 16 (a
  uniform guess over the 4 colours is ln 4 = 1.386); before and after;
- after the stage, what the prior does on its own (`paravt.run.prior.greedy_reading`): greedy
  rollouts at K = 16 (or each of `--budgets`) in the prior's dialect, R_acc of those without a
  tool block and of those with one, and the tool-block share (the weak prior's target: >= 0.8
  without tools at K = 16).

    python benchmarks/prior_reading.py [--arm weak] [--seed 1] [--budgets 2 16]
                                       [--greedy-only] [OVERRIDES...]   # e.g. prior.steps=80
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace

from paradox import compose


def held_out_sets(agent, samples, prior) -> dict:
    from paravt.modules.sft import example_from_trajectory
    from paravt.run.prior import prior_trajectories

    tok = agent.tokenizer
    kinds = {
        "search K=2": (replace(prior, tool_share=1.0, frame_budgets=(2,)), False),
        "search K=16": (replace(prior, tool_share=1.0, frame_budgets=(16,)), False),
        "oracle K=2": (replace(prior, tool_share=1.0, frame_budgets=(2,)), True),
        "direct K=16": (replace(prior, tool_share=0.0, oracle_steps=0, frame_budgets=(16,)), False),
    }
    return {
        name: [example_from_trajectory(t, tok) for t in prior_trajectories(agent, samples, c, o)]
        for name, (c, o) in kinds.items()
    }


def main(args: argparse.Namespace) -> None:
    from hydra.utils import instantiate

    from paravt.run.build import build_run
    from paravt.run.coldstart import ColdStartConfig, sft_stage
    from paravt.run.prior import (
        PRIOR_DIALECT,
        greedy_reading,
        prior_stage,
        reading_note,
        stage_agent,
    )

    with tempfile.TemporaryDirectory(prefix="prior-reading-") as run_dir:
        cfg = compose(args.seed, args.overrides, run_dir, args.arm)
        run = build_run(cfg)
        dm = run.datamodule
        dm.prepare_data()
        dm.setup("fit")
        agent = dm.connect(run.module)
        prior = instantiate(cfg.prior)
        held_out = list(dm.eval_samples)[: args.prompts]
        sets = {} if args.greedy_only else held_out_sets(agent, held_out, prior)
        meter = sft_stage(run.module.policy, run.module.processor, ColdStartConfig())

        def show(when: str) -> None:
            for name, examples in sets.items():
                loss, acc = meter.answer_metrics(examples)
                print(f"{when}: {name}: answer loss {loss:.3f}, accuracy {acc:.3f}", flush=True)

        show("before")
        t0 = time.perf_counter()
        losses = prior_stage(run.module, agent, dm.train_samples, prior)
        took = time.perf_counter() - t0
        print(f"prior: {prior.steps} steps, {took:.0f} s, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
        show("after")
        for k in args.budgets:
            t0 = time.perf_counter()
            forced = prior.forces_think(agent.cfg.force_think)
            r = greedy_reading(stage_agent(agent, PRIOR_DIALECT, forced), held_out, k)
            took = time.perf_counter() - t0
            share = f"tool-block share {r['tool_share']:.2f}"
            print(f"{reading_note('after', r)}; {share}, {took:.0f} s", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--arm", default="paragrpo", help="the experiment demo_prior_<arm>, e.g. weak"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompts", type=int, default=32, help="held-out samples measured")
    parser.add_argument(
        "--budgets", type=int, nargs="+", default=[16], help="frame budgets K of the greedy pass"
    )
    parser.add_argument(
        "--greedy-only", action="store_true", help="skip the teacher-forced answer sets"
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        help="Hydra overrides of the experiment, e.g. prior.steps=80 prior.oracle_steps=40",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    main(parse_args())
