"""One rank of the external-launcher check: `python external_launcher_worker.py MODEL_DIR OUT RANK`.

Joins a 2-rank gloo group as Lightning's launcher starts one (LOCAL_RANK, WORLD_SIZE and the
master address in the environment, no RANK; the rank passed to `init_process_group`), builds
`vllm.LLM` with `paravt.rollout.engines.vllm.llm_kwargs` under PARAVT_ASSUME_GPU=1 (set by the
test): the placement a W-rank GPU launch gets (the external launcher, from the live group) with the
CPU backend's own arguments, and `export_launch_env`; it generates greedily a different number of
times per rank (rank 0 twice, rank 1 once), as ranks with different agent rounds do.
"""

from __future__ import annotations

import json
import sys

import torch.distributed as dist

CALLS = {0: 2, 1: 1}  # generate calls per rank


def main(model_dir: str, out: str, rank: int) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=2)
    import vllm

    from paravt.parallel.collectives import leave_group
    from paravt.rollout.engines.vllm import llm_kwargs
    from paravt.rollout.engines.vllm_launch import export_launch_env, keep_engine_in_process
    from paravt.rollout.factory import EngineConfig

    keep_engine_in_process()
    cfg = EngineConfig(name="vllm", dtype="float32", max_model_len=512, max_num_seqs=4)
    kwargs = llm_kwargs(cfg, model_dir, 1)  # the GPU decisions, forced
    env = export_launch_env()
    llm = vllm.LLM(**kwargs)
    params = vllm.SamplingParams(max_tokens=4, temperature=0.0)
    tokens = []
    for _ in range(CALLS[rank]):
        result = llm.generate([{"prompt_token_ids": [11, 12, 13]}], params, use_tqdm=False)
        tokens.append(list(result[0].outputs[0].token_ids))
    parallel = llm.llm_engine.vllm_config.parallel_config
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(
            {
                "tokens": tokens,
                "env_rank": env["RANK"],
                "dp_size": parallel.data_parallel_size,
                "backend": parallel.distributed_executor_backend,
            },
            f,
        )
    leave_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
