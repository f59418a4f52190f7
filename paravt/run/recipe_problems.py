"""What keeps a training config from running on its GPUs, each problem with its fix:
`problems` (also run by `train.py` at start-up), the trainer's and the rollout servers'
GPU placement, the installs a config needs, notes, the files it opens; and `compose`, the
config exactly as `train.py` composes it."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

CONF = Path(__file__).resolve().parents[2] / "conf"
SERVER_ENGINE = "vllm_server"  # rollouts on generation servers apart from the trainer's GPUs
# The keys of conf/rollout/engine/vllm_server.yaml the checks read: running servers' base URLs
# (empty: paravt starts NUM of them), how many it starts, and the GPU ids it starts them on.
URLS, NUM, DEVICES = "server_urls", "num_servers", "devices"
HALF_PRECISION = {"bf16-true", "16-true", "bf16", "16", "half"}


@dataclass(frozen=True)
class Problem:
    """A reason the config cannot run, with the override that fixes it."""

    what: str
    fix: str

    def __str__(self) -> str:
        return f"{self.what}; fix: {self.fix}"


def world_size(cfg: DictConfig) -> int:
    trainer = cfg.trainer
    ids = trainer_device_ids(cfg)  # a list of ids (a ListConfig too) counts its GPUs
    devices = len(ids) if ids is not None else 1  # "auto" / -1: known only on the machine
    return max(devices, 1) * int(trainer.get("num_nodes", 1) or 1)


def _sharded(cfg: DictConfig) -> bool:
    return "strategy" in cfg.trainer and cfg.trainer.strategy is not None


def _engine_problems(cfg: DictConfig, world: int) -> list[Problem]:
    engine, agent = cfg.rollout.engine, cfg.rollout.agent
    if engine.get("name") not in ("vllm", SERVER_ENGINE):
        return []
    out = []
    if int(engine.max_model_len) < int(agent.max_total_tokens):
        out.append(
            Problem(
                f"rollout.engine.max_model_len={engine.max_model_len} is below "
                f"rollout.agent.max_total_tokens={agent.max_total_tokens}: trajectories fail "
                "mid-run at a later tool round",
                f"rollout.engine.max_model_len={agent.max_total_tokens} (or lower "
                "rollout.agent.max_total_tokens)",
            )
        )
    tp = int(engine.get("tensor_parallel_size", 1) or 1)
    if engine.name == "vllm" and tp > 1 and world > 1:
        out.append(
            Problem(
                f"rollout.engine.tensor_parallel_size={tp} under a {world}-rank data-parallel "
                "launch: each rank builds its own vLLM engine, which cannot form a tensor-"
                "parallel group across the trainer's ranks",
                "rollout.engine.tensor_parallel_size=1 (every rank's engine holds the whole "
                "model in bf16 while FSDP shards the trainer), or rollout/engine=hf",
            )
        )
    return out + _async_engine_problems(cfg)


def _async_engine_problems(cfg: DictConfig) -> list[Problem]:
    """Async rollouts with the in-process vLLM engine on GPUs (issue 50, finding 3): rank 0's GPU
    would hold the trainer's share, the trainer's own engine (built at setup in every mode: the
    held-out evaluation's), the generator's full policy copy and a second engine, which vLLM
    refuses to start when its share exceeds the memory still free; no pair of shares fits."""
    engine = cfg.rollout.engine
    mode = cfg.rollout.get("mode", "sync")
    async_mode = mode in ("async", "stream")
    if engine.get("name") != "vllm" or not async_mode or cfg.trainer.get("accelerator") != "gpu":
        return []
    return [
        Problem(
            f"rollout.mode={mode} with rollout/engine=vllm on GPUs: rank 0's GPU would hold the "
            "trainer, the trainer's in-process engine, the generator's copy of the policy and "
            "the generator's own engine; vLLM refuses the second engine (its share exceeds the "
            "free memory at its start), and lowering rollout.engine.gpu_memory_utilization "
            "does not make room for the copy",
            "rollout/engine=vllm_server (rollout servers on GPUs of their own, as "
            "experiment=paragrpo_1p7 does), or rollout.mode=sync with rollout/engine=vllm",
        )
    ]


def _trainer_problems(cfg: DictConfig, world: int) -> list[Problem]:
    out = []
    trainer = cfg.trainer
    if _sharded(cfg) and str(trainer.get("precision")) in HALF_PRECISION:
        out.append(
            Problem(
                f"trainer.precision={trainer.precision} casts the FSDP master weights and AdamW "
                "moments to half precision: an lr-2e-6 step rounds to zero for most weights",
                "trainer.precision=32-true (FSDP2's MixedPrecisionPolicy computes in bf16)",
            )
        )
    strategy = trainer.get("strategy") if _sharded(cfg) else None
    dp = strategy.get("data_parallel_size") if isinstance(strategy, DictConfig) else None
    if isinstance(dp, int) and dp != world:
        out.append(
            Problem(
                f"trainer.strategy.data_parallel_size={dp} but devices x num_nodes = {world}",
                "trainer=fsdp (its strategy follows devices x num_nodes)",
            )
        )
    if _sharded(cfg) and cfg.get("cold_start") is not None:
        out.append(
            Problem(
                "cold_start runs in one process before fit and cannot run under FSDP",
                "cold_start=null and start from an SFT checkpoint (experiment=sft_coldstart)",
            )
        )
    if _sharded(cfg) and not cfg.model.get("freeze_vision", True):
        out.append(
            Problem(
                "model.freeze_vision=false is not supported under FSDP",
                "model.freeze_vision=true (the paper's setting)",
            )
        )
    return out


# ---- what the GPU libraries cannot do under this launch ------------------------------------
def _library_problems(cfg: DictConfig, world: int) -> list[Problem]:
    """QLoRA or bitsandbytes' 8-bit AdamW under FSDP2, and a tensor-parallel engine colocated
    with a single-process trainer (the multi-rank case: `_engine_problems`)."""
    out = []
    lora = cfg.model.get("lora") or {}
    if _sharded(cfg) and lora.get("load_in_4bit") and int(lora.get("rank", 0) or 0) > 0:
        out.append(
            Problem(
                "model.lora.load_in_4bit=true (QLoRA) under FSDP: paravt shards fp32 master "
                "weights, and transformers refuses to cast a bitsandbytes 4-bit model to fp32",
                "model.lora.load_in_4bit=false (LoRA on a bf16 base, sharded by FSDP) or QLoRA "
                "on one GPU (trainer.devices=1 without trainer=fsdp)",
            )
        )
    if _sharded(cfg) and "8bit" in str(cfg.optimizer.get("_target_", "")):
        out.append(
            Problem(
                f"optimizer={cfg.optimizer._target_} under FSDP: bitsandbytes' 8-bit optimisers "
                "allocate their state like the DTensor parameters and hand the DTensors to "
                "their CUDA kernels (illegal memory access under FSDP2)",
                "optimizer=adamw (torch AdamW, whose state FSDP2 shards), or more ranks "
                "(trainer.devices) to fit its moments",
            )
        )
    engine = cfg.rollout.engine
    tp = int(engine.get("tensor_parallel_size", 1) or 1)
    if engine.get("name") == "vllm" and tp > 1 and world == 1:
        out.append(
            Problem(
                f"rollout.engine.tensor_parallel_size={tp} with the engine colocated in the "
                "trainer's process: vLLM runs tensor-parallel workers in processes of their own, "
                "and the in-place weight reload (a generator of the trainer's tensors) cannot "
                "be pickled to them",
                "rollout.engine.tensor_parallel_size=1 (the engine holds the whole model in "
                "bf16; shard the trainer with trainer=fsdp and more devices if it does not fit)",
            )
        )
    return out


# ---- where the trainer and the generation servers run (rollout/engine=vllm_server) -----------
def trainer_device_ids(cfg: DictConfig) -> list[int] | None:
    """The GPU ids `trainer.devices` takes on each node: a list as given, a count n the first
    n (Lightning's rule, and torchrun's LOCAL_RANK order), None where the machine decides
    ("auto", -1)."""
    devices = cfg.trainer.get("devices", 1)
    if isinstance(devices, str) and "," in devices:
        devices = [d for d in devices.split(",") if d.strip()]
    if isinstance(devices, list | tuple) or OmegaConf.is_list(devices):
        return [int(d) for d in devices]
    try:
        count = int(devices)
    except (TypeError, ValueError):
        return None
    return list(range(count)) if count >= 0 else None


def generation_devices(cfg: DictConfig) -> list[int]:
    """GPU ids of the generation servers paravt starts beside the trainer: none when the
    rollouts run in the trainer, or when `rollout.engine.server_urls` names running servers."""
    engine = cfg.rollout.engine
    if engine.get("name") != SERVER_ENGINE or engine.get(URLS):
        return []
    return [int(d) for d in engine.get(DEVICES) or []]


def _span(ids: list[int]) -> str:
    """GPU ids as printed: 0-6 for a run of them, else the list."""
    if len(ids) > 1 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}-{ids[-1]}"
    return str(ids[0]) if len(ids) == 1 else str(ids)


def _free_ids(taken: list[int], n: int) -> list[int]:
    """The n lowest GPU ids not in `taken` (the fix's suggestion)."""
    free = (i for i in itertools.count() if i not in taken)
    return list(itertools.islice(free, n))


def _server_problems(cfg: DictConfig) -> list[Problem]:
    """Servers paravt starts: as many GPUs as servers x tensor_parallel_size, each named once,
    none of them the trainer's."""
    engine = cfg.rollout.engine
    if engine.get("name") != SERVER_ENGINE or engine.get(URLS):
        return []
    servers = int(engine.get(NUM, 1) or 0)
    need = servers * int(engine.get("tensor_parallel_size", 1) or 1)
    gen, trainer = generation_devices(cfg), trainer_device_ids(cfg) or []
    if servers < 1:
        return [
            Problem(
                f"rollout/engine=vllm_server with no rollout.engine.{URLS} and "
                f"rollout.engine.{NUM}={servers}: nothing would generate",
                f"rollout.engine.{NUM}=1 rollout.engine.{DEVICES}={_free_ids(trainer, 1)} "
                f"(paravt starts it) or rollout.engine.{URLS}=[http://HOST:PORT] (running servers)",
            )
        ]
    if cfg.trainer.get("accelerator") != "gpu":  # on a CPU the servers share its cores
        return []
    out = []
    if len(gen) != need:
        out.append(
            Problem(
                f"rollout.engine.{DEVICES}={gen} names {len(gen)} GPU(s) for "
                f"rollout.engine.{NUM}={servers} x tensor_parallel_size = {need}",
                f"rollout.engine.{DEVICES}={_free_ids(trainer, need)}",
            )
        )
    twice = sorted({d for d in gen if gen.count(d) > 1})
    if twice:
        out.append(
            Problem(f"rollout.engine.{DEVICES} names GPU(s) {twice} twice", "one id per GPU")
        )
    shared = sorted(set(gen) & set(trainer))
    if shared:
        out.append(
            Problem(
                f"GPU(s) {shared} would hold both a trainer rank (trainer.devices="
                f"{cfg.trainer.devices} takes GPUs {_span(trainer)}) and a generation server "
                f"(rollout.engine.{DEVICES}={gen})",
                _overlap_fix(trainer, gen),
            )
        )
    return out


def _overlap_fix(trainer: list[int], gen: list[int]) -> str:
    """Fewer trainer ranks when the trainer takes the first n GPUs and the servers sit above
    some of them; else other GPU ids for the servers."""
    if trainer == list(range(len(trainer))) and min(gen) > 0:
        return f"trainer.devices={min(gen)} (GPUs {_span(list(range(min(gen))))})"
    return f"rollout.engine.{DEVICES}={_free_ids(trainer, len(gen))}"


def device_count_problems(cfg: DictConfig, gpus_per_node: int) -> list[Problem]:
    """The trainer's GPUs and the servers paravt starts beside it must exist on a node of
    `gpus_per_node` GPUs (`paravt check-recipe --gpus-per-node`)."""
    trainer = trainer_device_ids(cfg)
    if cfg.trainer.get("accelerator") != "gpu" or trainer is None:
        return []
    gen = generation_devices(cfg)
    used = len(trainer) + len(gen)
    if used > gpus_per_node:
        what = f"trainer.devices={cfg.trainer.devices}"
        what += f" and rollout.engine.{DEVICES}={gen}" if gen else ""
        spare = gpus_per_node - len(gen)
        return [
            Problem(
                f"{what} need {used} GPUs on a node of {gpus_per_node} (--gpus-per-node)",
                f"trainer.devices={spare}"
                + (f", or servers on other machines: rollout.engine.{URLS}=[...]" if gen else ""),
            )
        ]
    missing = sorted(d for d in set(trainer) | set(gen) if d >= gpus_per_node)
    if missing:
        return [
            Problem(
                f"GPU id(s) {missing} do not exist on a node of {gpus_per_node} GPUs "
                f"(ids 0 to {gpus_per_node - 1})",
                f"ids below {gpus_per_node} in trainer.devices / rollout.engine.{DEVICES}",
            )
        ]
    return []


def placement(cfg: DictConfig) -> str:
    """Where the trainer's ranks and the rollouts run, as `paravt check-recipe` prints it."""
    trainer, nodes = trainer_device_ids(cfg), int(cfg.trainer.get("num_nodes", 1) or 1)
    where = f"GPUs {_span(trainer)}" if trainer else f"devices={cfg.trainer.get('devices')}"
    if cfg.trainer.get("accelerator") != "gpu":
        where = f"{cfg.trainer.get('accelerator')} devices={cfg.trainer.get('devices')}"
    text = f"placement: trainer on {where} of each of {nodes} node(s); rollouts "
    engine = cfg.rollout.engine
    if engine.get("name") != SERVER_ENGINE:
        return text + f"in the trainer's processes (rollout/engine={engine.get('name')})"
    if engine.get(URLS):
        return text + f"on {len(engine[URLS])} running server(s) at rollout.engine.{URLS}"
    servers = int(engine.get(NUM, 1) or 0)
    return text + f"on {servers} server(s) paravt starts on GPU(s) {generation_devices(cfg)}"


def problems(cfg: DictConfig) -> list[Problem]:
    """Every reason `cfg` cannot run on W = devices x num_nodes ranks (empty: it can)."""
    if cfg.get("stage", "rl") == "sft":
        return []
    world = world_size(cfg)
    out = []
    if int(cfg.data.get("batch_size", 1)) < 1:
        out.append(Problem("data.batch_size must be >= 1", "data.batch_size=7"))
    out += _trainer_problems(cfg, world) + _engine_problems(cfg, world)
    return out + _server_problems(cfg) + _library_problems(cfg, world)


def missing_installs(cfg: DictConfig) -> list[Problem]:
    """What the config needs that this Python lacks: `train.py` refuses to start on it;
    `check-recipe` only notes it (it plans a GPU run, often from another machine)."""
    from importlib.util import find_spec

    if cfg.get("stage", "rl") == "sft" or cfg.rollout.engine.get("name") != "vllm":
        return []
    if find_spec("vllm") is not None:
        return []
    return [
        Problem(
            "rollout/engine=vllm (experiment=paragrpo's engine) needs vLLM, not installed in "
            "this Python",
            "pip install -e '.[vllm]' on the GPU machine (on a CPU: make venv-vllm and run "
            ".venv-vllm/bin/python), or rollout/engine=hf",
        )
    ]


def notes(cfg: DictConfig) -> list[str]:
    """What runs, but differently than one might assume."""
    world, b = world_size(cfg), int(cfg.data.get("batch_size", 1))
    out = []
    if world > 1 and b % world:
        idle = f"; {world - b} rank(s) get none" if b < world else ""
        out.append(
            f"{b} prompts over {world} ranks: shares of {math.ceil(b / world)} or {b // world} "
            f"prompts{idle} (zero-weight passes; the update equals one rank's)"
        )
    engine, nodes = cfg.rollout.engine, int(cfg.trainer.get("num_nodes", 1) or 1)
    if engine.get("name") == SERVER_ENGINE and world > 1:
        out.append(server_ranks_note(cfg, world))
    if engine.get("name") == SERVER_ENGINE and not engine.get(URLS) and nodes > 1:
        out.append(
            f"trainer.num_nodes={nodes} with servers paravt starts: for a multi-node run start "
            f"the servers apart and give them in rollout.engine.{URLS} (docs/training.md)"
        )
    if world > 1 and int(cfg.algorithm.get("ppo_mini_batches", 1)) > 1:
        out.append(
            "algorithm.ppo_mini_batches > 1 splits each rank's share, not the global batch: "
            "valid updates, not bit-equal to one rank's"
        )
    return out


def server_ranks_note(cfg: DictConfig, world: int) -> str:
    """How W trainer ranks share the generation servers (`paravt.rollout.serving.client`)."""
    engine = cfg.rollout.engine
    who = "running servers" if engine.get(URLS) else "servers rank 0 starts (its URLs sent to all)"
    if cfg.rollout.get("mode", "sync") in ("async", "stream"):
        gen = (
            "rank 0's generator process samples every step's whole batch on them and reloads "
            "each server once per published version (every rank joins the gather)"
        )
    else:
        gen = (
            "each rank generates its own share of the groups on them; a weight sync is one "
            "per step (every rank joins the gather, rank 0 writes one checkpoint and reloads "
            "each server once, every rank takes its version)"
        )
    return (
        f"{world} trainer ranks share the {who}: {gen}; a failed server stops every rank. "
        "Run on CPU ranks over gloo; not verified on GPUs (NCCL)"
    )


def files_to_open(cfg: DictConfig) -> list[tuple[str, str]]:
    """(config key, path) of the files the run and its callbacks read."""
    out = [("model.path", f"{cfg.model.path}/config.json")]
    out.append(("data.train_path", str(cfg.data.get("train_path"))))
    if cfg.data.get("eval_path"):
        out.append(("data.eval_path", str(cfg.data.eval_path)))
    for name, cb in (cfg.get("callbacks") or {}).items():
        if cb is not None and cb.get("samples_path"):
            out.append((f"callbacks.{name}.samples_path", str(cb.samples_path)))
    return out


# ---- the config as train.py composes it ----------------------------------------------------
# The config groups that are plain dataclasses under a `_target_`: instantiating one checks its
# keys and values and builds nothing heavy (train.py does it before anything is built).
LIGHT_GROUPS = ("model", "rollout", "algorithm", "reward", "prior", "cold_start")


def check_light_groups(cfg: DictConfig) -> None:
    """Instantiate each of `LIGHT_GROUPS` that `cfg` has: a misspelt key or a value no run can
    use raises (Hydra's InstantiationException, its cause naming the key)."""
    from hydra.utils import instantiate

    for group in LIGHT_GROUPS:
        if cfg.get(group) is not None and "_target_" in cfg[group]:
            instantiate(cfg[group])


def config_problems(cfg: DictConfig) -> list[Problem]:
    """`check_light_groups` as a `Problem` (check-recipe prints it beside the others)."""
    from paravt.errors import user_message

    try:
        check_light_groups(cfg)
    except Exception as error:
        message = user_message(error)
        if message is None:
            raise
        return [Problem(message, "correct that override (train.py refuses the same at start)")]
    return []


def compose(overrides: list[str]) -> DictConfig:
    """The config `train.py` composes from `overrides` (conf/train.yaml, same defaults)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(str(CONF), version_base="1.3"):
        return hydra_compose("train", overrides=list(overrides))
