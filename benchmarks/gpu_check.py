"""What only a GPU can show: the real-size architectures with random weights (bf16), their act / log-prob / training
step times and peak memory, and train_srpo.py's iteration from a 7B folder. Prints one JSON line per figure. (Each
training script's first iterations on CUDA: tests/test_gpu_scripts.py, which asserts them.)

    python benchmarks/gpu_check.py --part oft7b_lora     # OpenVLA-OFT 7B, LoRA r=32 + gradient checkpointing
    python benchmarks/gpu_check.py --part oft7b_full     # OpenVLA-OFT 7B, full fine-tuning, fp32 master weights, 1 GPU
    python benchmarks/gpu_check.py --part pi0_expert     # pi0 (PaliGemma 3B + 300M expert), expert-only recipe
    python benchmarks/gpu_check.py --part srpo_7b --variants "" "train.strategy=fsdp"  # SRPO from a random 7B folder
    python benchmarks/gpu_check.py --part fsdp_lora          # OpenVLA-OFT 7B through common/fsdp.py, 1 process, LoRA
    python benchmarks/gpu_check.py --part fsdp_full_offload  # the same, full fine-tuning with train.fsdp_offload

Random weights: no checkpoint is needed (or downloadable here); the OpenVLA-OFT folder is the published config.json
with the tiny fixture's statistics and tokenizer. Results are written up in docs/gpu.md.
"""
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "tiny_openvla_oft")
INSTRUCTION = "put both the alphabet soup and the tomato sauce in the basket"


def emit(**row):
    print(json.dumps(row), flush=True)


def gib(x):
    return round(x / 2 ** 30, 2)


def timed(fn, repeats=3):
    fn()  # warm-up (kernels, allocator)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        out = fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / repeats, out


def oft_folder():
    """The published 7B config.json (towers + Llama-2 7B text config) beside the fixture's statistics/tokenizer."""
    folder = tempfile.mkdtemp(prefix="oft7b_")
    for name in os.listdir(FIXTURE):
        if not name.endswith(".safetensors") and not name.endswith(".index.json"):
            shutil.copy(os.path.join(FIXTURE, name), folder)
    with open(os.path.join(FIXTURE, "config.json")) as f:
        cfg = json.load(f)
    cfg["timm_model_ids"] = ["vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_224"]
    cfg["text_config"] = {"model_type": "llama", "vocab_size": 32064, "pad_token_id": 32000,
                          "torch_dtype": "bfloat16"}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    return folder


def oft_obs(b):
    rng = np.random.default_rng(0)
    return {"agentview": rng.integers(0, 256, (b, 224, 224, 3), dtype=np.uint8), "instructions": [INSTRUCTION] * b}


def build_oft(lora_rank, bf16_weights, ckpt):
    from models.openvla_oft import OpenVLAOFTConfig, OpenVLAOFTPolicy

    cfg = OpenVLAOFTConfig(init_path=oft_folder(), lora_rank=lora_rank, bf16_weights=bf16_weights,
                           gradient_checkpointing=ckpt)
    t0 = time.perf_counter()
    with torch.device("cuda"):
        policy = OpenVLAOFTPolicy(cfg, _load_weights=False)  # random init, built on the GPU
    torch.cuda.synchronize()
    n = sum(p.numel() for p in policy.parameters())
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    emit(part="build", lora_rank=lora_rank, bf16_weights=bf16_weights, params=n, trainable=trainable,
         seconds=round(time.perf_counter() - t0, 1), allocated_gib=gib(torch.cuda.memory_allocated()))
    return policy


def oft_act(policy, sizes=(1, 8, 32)):
    policy.eval()
    for b in sizes:
        obs = oft_obs(b)
        torch.cuda.reset_peak_memory_stats()
        s, out = timed(lambda: policy.act(obs))
        emit(part="oft7b_act", batch=b, seconds=round(s, 4), per_obs_ms=round(1000 * s / b, 1),
             peak_gib=gib(torch.cuda.max_memory_allocated()), action_shape=list(out[0].shape))


def timed_updates(policy, micro, step, steps=2):
    """`steps` updates of -mean log-prob of random bin tokens on `micro` random observations, `step()` after each
    backward; yields (index, forward + backward seconds, step seconds), peak memory counted from the first."""
    obs, tokens = oft_obs(micro), torch.randint(0, 256, (micro, 56), device="cuda")
    torch.cuda.reset_peak_memory_stats()
    for i in range(steps):
        t0 = time.perf_counter()
        logp, _ = policy.log_prob(obs, None, tokens)
        (-logp.mean()).backward()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        yield i, t1 - t0, time.perf_counter() - t1


def oft_train_step(policy, opt, micro, steps=2, tag=""):
    policy.train()
    obs = oft_obs(micro)
    tokens = torch.randint(0, 256, (micro, 56), device="cuda")

    def step():
        logp, ent = policy.log_prob(obs, None, tokens)
        loss = -logp.mean() - 0.0 * ent.mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    torch.cuda.reset_peak_memory_stats()
    s, loss = timed(step, repeats=steps)
    emit(part=f"oft7b_train{tag}", micro_batch=micro, seconds_per_step=round(s, 3),
         peak_gib=gib(torch.cuda.max_memory_allocated()), reserved_gib=gib(torch.cuda.max_memory_reserved()),
         loss=round(loss, 4))


def part_oft7b_lora():
    policy = build_oft(lora_rank=32, bf16_weights=True, ckpt=True)
    oft_act(policy)
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5, fused=True)
    for micro in (4, 16):
        oft_train_step(policy, opt, micro, tag="_lora32_ckpt")
    policy.set_gradient_checkpointing(False)
    oft_train_step(policy, opt, 4, tag="_lora32_no_ckpt")


def part_oft7b_full():
    """SimpleVLA-RL's recipe on one GPU without sharding: fp32 weights (AdamW master copy), bf16 autocast."""
    policy = build_oft(lora_rank=0, bf16_weights=False, ckpt=True)
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-6, fused=True)
    for micro in (2, 8):
        try:
            oft_train_step(policy, opt, micro, steps=1, tag="_full_fp32_ckpt")
        except torch.cuda.OutOfMemoryError as e:
            emit(part="oft7b_train_full_fp32_ckpt", micro_batch=micro, oom=str(e).splitlines()[0][:200])
            break


def part_fsdp(offload, micro=4):
    """OpenVLA-OFT 7B trained through common/fsdp.py on one GPU (train.strategy=fsdp, one process): LoRA r=32, or
    (`offload`) full fine-tuning with train.fsdp_offload (fp32 shards + AdamW on the host). Every line also gives the
    peak host RSS."""
    from types import SimpleNamespace

    from accelerate import Accelerator

    from common import fsdp
    from common.train import adamw_with_warmup, optimizer_step
    from models.openvla_oft import OpenVLAOFTConfig, OpenVLAOFTPolicy

    def emit_rss(**row):
        row["host_peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20, 2)
        emit(**row)

    lora, name = not offload, "full_offload" if offload else "lora"
    cfg = OpenVLAOFTConfig(init_path=oft_folder(), lora_rank=32 if lora else 0, bf16_weights=lora,
                           gradient_checkpointing=True)
    t0 = time.perf_counter()
    with torch.device("cpu" if not lora else "cuda"):  # full FT: fp32 weights built on the host, sharded to it
        policy = OpenVLAOFTPolicy(cfg, _load_weights=False)
    run = SimpleNamespace(accelerator=Accelerator(), device=torch.device("cuda"), world=1,
                          cfg=SimpleNamespace(train=SimpleNamespace(strategy="fsdp", fsdp_offload=not lora)))
    policy = fsdp.shard_policy(run, policy)
    params = [p for p in policy.parameters() if p.requires_grad]
    opt, sched = adamw_with_warmup(params, lr=1e-6, weight_decay=0.0, warmup_steps=1)
    fsdp.register(policy, [opt])
    torch.cuda.synchronize()
    emit_rss(part=f"fsdp_{name}_build", seconds=round(time.perf_counter() - t0, 1),
             params=sum(p.numel() for p in policy.parameters()), trainable=sum(p.numel() for p in params),
             gpu_allocated_gib=round(torch.cuda.memory_allocated() / 2 ** 30, 2))

    def step():
        optimizer_step(run, params, opt, sched, max_norm=1.0, policy=policy)
        opt.zero_grad(set_to_none=True)

    with fsdp.sharded(policy):  # the update mode: layers gathered one by one in forward and backward
        for i, fwd_bwd, stepped in timed_updates(policy, micro, step):
            emit_rss(part=f"fsdp_{name}_update", step=i, micro_batch=micro, fwd_bwd_s=round(fwd_bwd, 2),
                     step_s=round(stepped, 2), gpu_peak_gib=round(torch.cuda.max_memory_allocated() / 2 ** 30, 2))


def part_pi0_expert():
    from models.flow_policy import FlowPolicy, FlowPolicyConfig

    cfg = FlowPolicyConfig(preset="pi0", image_size=224, action_chunk=5, horizon=50, train_expert_only=True,
                           bf16_weights=True, num_steps=10)
    t0 = time.perf_counter()
    with torch.device("cuda"):
        policy = FlowPolicy(cfg)
    torch.cuda.synchronize()
    n = sum(p.numel() for p in policy.parameters())
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    emit(part="pi0_build", params=n, trainable=trainable, seconds=round(time.perf_counter() - t0, 1),
         allocated_gib=gib(torch.cuda.memory_allocated()))
    rng = np.random.default_rng(0)

    def obs(b):
        return {"agentview": rng.integers(0, 256, (b, 224, 224, 3), dtype=np.uint8),
                "wrist": rng.integers(0, 256, (b, 224, 224, 3), dtype=np.uint8),
                "state": rng.standard_normal((b, 8)).astype(np.float32), "instructions": [INSTRUCTION] * b}

    policy.eval()
    for b in (1, 8, 32):
        o = obs(b)
        torch.cuda.reset_peak_memory_stats()
        with torch.no_grad():
            s, out = timed(lambda: policy.sample(o, noise_level=0.5))
        emit(part="pi0_sample_10_steps", batch=b, seconds=round(s, 4), per_obs_ms=round(1000 * s / b, 1),
             peak_gib=gib(torch.cuda.max_memory_allocated()), action_shape=list(out.actions.shape))
    policy.train()
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=5e-6, fused=True)
    for micro in (8, 32):
        o = obs(micro)
        actions = torch.randn(micro, policy.horizon, 7)

        def step():
            loss, _ = policy.flow_matching_loss(o, None, actions)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return float(loss.detach())

        torch.cuda.reset_peak_memory_stats()
        try:
            s, loss = timed(step, repeats=2)
            emit(part="pi0_expert_only_train", micro_batch=micro, seconds_per_step=round(s, 3),
                 peak_gib=gib(torch.cuda.max_memory_allocated()), loss=round(loss, 4))
        except torch.cuda.OutOfMemoryError as e:
            emit(part="pi0_expert_only_train", micro_batch=micro, oom=str(e).splitlines()[0][:200])


def part_srpo_7b(variants=("",)):
    """train_srpo.py on the embedded suite from a random OpenVLA-OFT 7B folder in the published layout (saved here
    first): one iteration, LoRA r=32, bf16 frozen base, gradient checkpointing; one run per variant (a string of
    space-separated overrides, e.g. "train.strategy=fsdp")."""
    from models.openvla_oft import OpenVLAOFTConfig, OpenVLAOFTPolicy

    folder = tempfile.mkdtemp(prefix="oft7b_published_")
    t0 = time.perf_counter()
    with torch.device("cuda"):
        policy = OpenVLAOFTPolicy(OpenVLAOFTConfig(init_path=oft_folder(), bf16_weights=True), _load_weights=False)
    policy.save(folder)
    del policy
    torch.cuda.empty_cache()
    emit(part="srpo_7b_folder", seconds=round(time.perf_counter() - t0, 1),
         gib_on_disk=gib(sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))))
    for variant in variants or ("",):
        _srpo_7b_run(folder, variant.split())


def _srpo_7b_run(folder, extra):
    out = tempfile.mkdtemp(prefix="srpo7b_")
    args = ["--task-id", "0", "--gpu", "0", "--no-wandb", f"init.path={folder}", "policy.type=openvla_oft",
            "policy.lora_rank=32", "policy.bf16_weights=true", "policy.gradient_checkpointing=true", "env.num_envs=8",
            "env.max_steps=24", "rollout.n=8", "rollout.prompts_per_iteration=1", "algorithm.filter_accuracy=false",
            "algorithm.entropy_coeff=0.001", "reward.mode=binary", "eval.every=0", "train.iterations=1",
            "train.mini_batch_size=8", "train.micro_batch_size=4", f"log.output_dir={out}/runs",
            f"log.plots_dir={out}/plots", *extra]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]), WANDB_MODE="disabled")
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "train_srpo.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=400)
    rows = []
    for root, _, files in os.walk(os.path.join(out, "runs")):
        if "metrics.jsonl" in files:
            with open(os.path.join(root, "metrics.jsonl")) as f:
                rows = [json.loads(line) for line in f]
    last = rows[-1] if rows else {}
    emit(part="srpo_7b", extra=list(extra), rc=p.returncode, seconds=round(time.perf_counter() - t0, 1),
         **{k: last.get(k) for k in ("time/rollout", "time/update", "time/iteration", "train/grad_norm",
                                     "perf/max_memory_allocated_gb", "charts/env_steps")},
         tail=(p.stdout + p.stderr)[-1500:] if p.returncode else "")


PARTS = {"oft7b_lora": part_oft7b_lora, "oft7b_full": part_oft7b_full, "srpo_7b": part_srpo_7b, "fsdp_lora": part_fsdp,
         "fsdp_full_offload": part_fsdp, "pi0_expert": part_pi0_expert}

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=sorted(PARTS), required=True)
    ap.add_argument("--variants", nargs="*", default=[""], help="srpo_7b: one run per string of overrides")
    ap.add_argument("--micro", type=int, default=4, help="fsdp_*: micro-batch of each update")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/gpu_check.py needs a CUDA GPU")
    emit(part="device", name=torch.cuda.get_device_name(), torch=torch.__version__,
         total_gib=gib(torch.cuda.get_device_properties(0).total_memory))
    if args.part == "srpo_7b":
        part_srpo_7b(args.variants)
    elif args.part.startswith("fsdp_"):
        part_fsdp(offload=args.part == "fsdp_full_offload", micro=args.micro)
    else:
        PARTS[args.part]()
