"""Does the tool prior learn to see? Held-out answer tokens before and after the prior stage.

Composes `experiment=demo_prior_paragrpo seed=0` with the given overrides, trains the tool
prior alone (`paravt.run.prior.prior_stage`, no cache, no cold start) and measures the answer
tokens teacher-forced (`SFTModule.answer_metrics`: mean NLL and argmax accuracy) on 32
held-out trajectories of four kinds, in the prior's dialect: `<tool_code>` searches at K = 2 and
K = 16, oracle crops (around the needle) at K = 2, direct answers at K = 16. A uniform guess
over the 4 colours is ln 4 = 1.386.

    python benchmarks/prior_reading.py [OVERRIDES...]   # e.g. prior.steps=80 prior.oracle_steps=40
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
        "search K=2": (replace(prior, tool_share=1.0, budgets=(2,)), False),
        "search K=16": (replace(prior, tool_share=1.0, budgets=(16,)), False),
        "oracle K=2": (replace(prior, budgets=(2,)), True),
        "direct K=16": (replace(prior, tool_share=0.0, oracle_steps=0, budgets=(16,)), False),
    }
    return {
        name: [example_from_trajectory(t, tok) for t in prior_trajectories(agent, samples, c, o)]
        for name, (c, o) in kinds.items()
    }


def main(overrides: list[str]) -> None:
    from hydra.utils import instantiate

    from paravt.run.build import build_run
    from paravt.run.coldstart import ColdStartConfig, sft_stage
    from paravt.run.prior import prior_stage

    with tempfile.TemporaryDirectory(prefix="prior-reading-") as run_dir:
        cfg = compose(0, overrides, run_dir)
        run = build_run(cfg)
        dm = run.datamodule
        dm.prepare_data()
        dm.setup("fit")
        agent = dm.connect(run.module)
        prior = instantiate(cfg.prior)
        sets = held_out_sets(agent, list(dm.eval_samples)[:32], prior)
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        help="Hydra overrides of experiment=demo_prior_paragrpo, e.g. prior.steps=80 "
        "prior.oracle_steps=40",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    main(parse_args().overrides)
