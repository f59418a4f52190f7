"""One rank of the external-launcher check: `python external_launcher_worker.py MODEL_DIR OUT`.

Builds `vllm.LLM` with the CPU arguments of `paravt.rollout.vllm.llm_kwargs` plus the launch
arguments `gpu_launch_kwargs` gives a W-rank GPU launch (external_launcher, data_parallel_size
= W), inside a gloo process group as the trainer's launcher sets it up, and generates greedily.
"""

from __future__ import annotations

import json
import sys

import torch.distributed as dist


def main(model_dir: str, out: str) -> None:
    dist.init_process_group("gloo")
    import vllm

    from paravt.rollout.factory import EngineConfig
    from paravt.rollout.vllm import llm_kwargs
    from paravt.rollout.vllm_launch import gpu_launch_kwargs, keep_engine_in_process

    keep_engine_in_process()
    cfg = EngineConfig(name="vllm", dtype="float32", max_model_len=512, max_num_seqs=4)
    kwargs = llm_kwargs(cfg, model_dir, 1) | gpu_launch_kwargs(1, dist.get_world_size())
    llm = vllm.LLM(**kwargs)
    params = vllm.SamplingParams(max_tokens=4, temperature=0.0)
    result = llm.generate([{"prompt_token_ids": [11, 12, 13]}], params, use_tqdm=False)
    rank = dist.get_rank()
    parallel = llm.llm_engine.vllm_config.parallel_config
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(
            {
                "tokens": list(result[0].outputs[0].token_ids),
                "dp_rank": parallel.data_parallel_rank,
                "dp_size": parallel.data_parallel_size,
                "backend": parallel.distributed_executor_backend,
            },
            f,
        )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
