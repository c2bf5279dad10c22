"""Re-check docs/recipes.md's citations against local checkouts of the references: does each row's cited file:line
(at the pinned commit) hold the value the row says the reference uses?

For every table row the script reads each cited `file:line@commit` (git show, so any clone or mirror that has the
commit works, whatever is checked out), then looks in those lines for the row's expected text: the literals of its
"reference" cell (numbers compared as numbers, so 5e-6 matches 5.0e-6; identifiers with `_` and `true`/`false`), or
EXPECT's text for a row whose cell says it in words. A row is `ok` (an expected literal is there), `MISS` (none is:
the citation drifted or is wrong), `words` (the cell has no literal and EXPECT no text for it: read it by hand, then
add its text to EXPECT), or `no-ref` (no checkout given for its reference). Exit status 1 when any row is MISS.

    python benchmarks/recipes_recheck.py --mirror-root /work/.mirror          # <root>/<owner>+<name>/repo clones
    python benchmarks/recipes_recheck.py --ref siiRL=~/src/siiRL --ref RLinf=~/src/RLinf ...
    python benchmarks/recipes_recheck.py --mirror-root /work/.mirror --only MISS   # just the drifted rows
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from typing import Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPES = os.path.join(ROOT, "docs", "recipes.md")

# reference short name -> (GitHub owner/name, pinned commit) as docs/recipes.md's first table names them
REFERENCES: Dict[str, Tuple[str, str]] = {
    "siiRL": ("sii-research/siiRL", "af00a77"),
    "SimpleVLA-RL": ("PRIME-RL/SimpleVLA-RL", "7c51662"),
    "OpenVLA-OFT-RL": ("AbhinandanVellanki/OpenVLA-OFT-RL", "f82c92f"),
    "RLinf": ("RLinf/RLinf", "a3816b5"),
    "FlowIPO": ("jiabingyang01/FlowIPO", "c8a97cd"),
    "LUFFY": ("ElliottYan/LUFFY", "01f4ae0"),
    "openvla-oft": ("moojink/openvla-oft", "213c5ff"),
}
# the tables' short file names -> the path in the reference
SHORT = {
    ("siiRL", "script"): "examples/embodied_srpo_trainer/run_openvla_oft_libero_spatial.sh",
    ("SimpleVLA-RL", "SVLA script"): "examples/run_openvla_oft_rl_libero.sh",
    ("OpenVLA-OFT-RL", "start"): "start_gae_ppo_training.py",
    ("RLinf", "ppo_openpi.yaml"): "examples/embodiment/config/libero_spatial_ppo_openpi.yaml",
    ("FlowIPO", "quickstart"): "examples/embodiment/config/libero_object_flowsar_openpi_quickstart.yaml",
    ("LUFFY", "train.sh"): "exp_scripts/train.sh",
    ("LUFFY", "mix_ppo_trainer.yaml"): "luffy/verl/verl/mix_src/config/mix_ppo_trainer.yaml",
    ("RLinf", "model/pi0.yaml"): "examples/embodiment/config/model/pi0.yaml",
    ("RLinf", "env/libero_spatial.yaml"): "examples/embodiment/config/env/libero_spatial.yaml",
    ("RLinf", "openpi_action_model.py"): "rlinf/models/embodiment/openpi/openpi_action_model.py",
}
# (config, key or the key-less row's first cell) -> text the cited lines must hold, for cells written in words
EXPECT: Dict[Tuple[str, str], str] = {
    ("srpo_libero.yaml", "rollout.refill"): "filter_plugin",
    ("srpo_libero.yaml", "— old-log-prob recompute"): "compute_old_log_prob",
    ("gae_ppo_libero.yaml", "env.wrist_camera"): "num_images_in_input",
    ("gae_ppo_libero.yaml", "init.mode"): "use_tokenized_actions",
    ("gae_ppo_libero.yaml", "policy.from_l1_checkpoint"): "load_l1_action_head=False",
    ("gae_ppo_libero.yaml", "policy.num_images"): "num_images_in_input: int = 2",
    ("gae_ppo_libero.yaml", "policy.use_proprio"): "use_proprio: bool = True",
    ("gae_ppo_libero.yaml", "policy.proprio_norm"): "proprio_tensor = torch.from_numpy(proprio)",
    ("gae_ppo_libero.yaml", "policy.image_pipeline"): "center_crop",
    ("gae_ppo_libero.yaml", "algorithm.value_loss"): "mse_loss",
    ("gae_ppo_libero.yaml", "train.bc_warmup_env_steps"): "use_l1_warmstart: bool = True",
    ("gae_ppo_libero_cpu.yaml", "— warm-up"): "use_l1_warmstart: bool = True",
    ("gae_ppo_libero.yaml", "— action-token logits"): "action_logits[..., -256:]",
    ("gae_ppo_libero.yaml", "— executed actions"): "process_action_for_libero(action)",
    ("gae_ppo_libero.yaml", "algorithm.negative_clip_band"): "clip_low = torch.clamp(ratio, 1 - self.cfg.clip_ratio_high",
    ("gae_ppo_libero_cpu.yaml", "algorithm.negative_clip_band"): "clip_low = torch.clamp(ratio, 1 - self.cfg.clip_ratio_high",
    ("gae_ppo_libero.yaml", "algorithm.loss_skip_above"): "if torch.abs(policy_loss).item() > 100.0:",
    ("gae_ppo_libero_cpu.yaml", "algorithm.loss_skip_above"): "if torch.abs(policy_loss).item() > 100.0:",
    ("gae_ppo_libero_pi0.yaml", "algorithm.clip_ratio_c"): "clip_ratio_c",
    ("gae_ppo_libero_pi0.yaml", "policy.value_input"): "_compute_value_from_suffix(suffix_out)",
    ("gae_ppo_libero_pi0.yaml", "value_head.init"): 'nonlinearity=nonlinearity',
    ("gae_ppo_libero_pi0.yaml", "value_head.activation"): 'value_head_activation = "relu"',
    ("gae_ppo_libero.yaml", "value_head.activation"): "nn.ReLU()",
    ("gae_ppo_libero_cpu.yaml", "value_head.activation"): "nn.ReLU()",
    ("gae_ppo_libero.yaml", "value_head.init"): "nn.Linear(input_dim, hidden_dim)",
    ("gae_ppo_libero_cpu.yaml", "value_head.init"): "nn.Linear(input_dim, hidden_dim)",
    ("gae_ppo_libero_pi0.yaml", "algorithm.loss_agg_mode"): "masked_mean_ratio",
    ("gae_ppo_libero_pi0.yaml", "algorithm.value_loss"): "huber_loss",
    ("gae_ppo_libero_pi0.yaml", "algorithm.value_loss_coef"): "actor_loss + critic_loss",
    ("gae_ppo_libero_pi0.yaml", "train.grad_clip_mode"): "clip_grad_norm_",
    ("gae_ppo_libero_pi0.yaml", "train.mini_batch_unit"): "batch_size_per_rank",
    ("gae_ppo_libero_pi0.yaml", "train.lr_warmup_steps"): "lr_warmup_steps",
    ("flowsar_libero.yaml", "train.mini_batch_unit"): "batch_size_per_rank",
    ("flowsar_libero_rlinf.yaml", "train.mini_batch_unit"): "batch_size_per_rank",
    ("gae_ppo_libero.yaml", "algorithm.gae_unit"): "trajectory_buffer.add",
    ("srpo_libero_cpu.yaml", "train.ppo_mini_batch_size"): "PPO_MINI_BATCH_SIZE * ROLLOUT_N_SAMPLES",
    ("srpo_libero_grpo_cpu.yaml", "train.ppo_mini_batch_size"): "PPO_MINI_BATCH_SIZE * ROLLOUT_N_SAMPLES",
    ("srpo_libero_grpo_cpu.yaml", "algorithm.loss_agg_mode"): "loss",
    ("srpo_libero.yaml", "reward.scope"): "compute_reward",
    ("srpo_libero.yaml", "— surplus kept groups"): "_cleanup_step_buffers",
    ("srpo_libero_cpu.yaml", "— reward scope"): "compute_reward",
    # the rows whose reference cell is words only: the cited line's text, read by hand against the cell (2026-12-07)
    ('srpo_libero.yaml', 'env.task_ids'): 'actor_rollout_ref.embodied.env.num_trials_per_ta',
    ('srpo_libero.yaml', 'env.pipeline'): 'export NUM_ENVS=16',
    ('srpo_libero.yaml', 'env.wrist_camera'): 'export NUM_IMAGES_IN_INPUT=1',
    ('srpo_libero.yaml', 'init.mode'): 'export MODEL_PATH=$HOME_PATH/models/Sylvest/Open',
    ('srpo_libero.yaml', 'policy.type'): 'export MODEL_NAME=openvla-oft-7b',
    ('srpo_libero.yaml', 'policy.image_pipeline'): 'export CENTER_CROP=True',
    ('srpo_libero.yaml', 'reward.mode'): 'export ALG=srpo',
    ('srpo_libero.yaml', 'reward.encoder.fp16'): 'export ENABLE_FP16=True',
    ('srpo_libero.yaml', 'reward.encoder.batch_size'): 'def extract_video_embedding_batch(self, video_te',
    ('srpo_libero.yaml', 'reward.encoder.pooling'): 'return embedding.mean(dim=1).to(torch.float32).s',
    ('srpo_libero.yaml', 'algorithm.adv_estimator'): 'algorithm.adv_estimator=grpo',
    ('srpo_libero.yaml', 'train.lr_schedule'): 'warmup_style: str = field(default="constant", me',
    ('srpo_libero.yaml', 'train.mini_batch_unit'): 'dataloader = batch.split(self.config.ppo_mini_ba',
    ('gae_ppo_libero.yaml', 'env.pipeline'): 'num_envs: int = 1',
    ('gae_ppo_libero.yaml', 'policy.type'): 'use_tokenized_actions: true',
    ('gae_ppo_libero.yaml', 'policy.bf16_weights'): 'CRITICAL: DataParallel REPLICATES the model on e',
    ('gae_ppo_libero.yaml', 'policy.gradient_checkpointing'): 'CRITICAL: DataParallel REPLICATES the model on e',
    ('gae_ppo_libero.yaml', 'algorithm.ratio_unit'): 'log_prob = log_prob.mean()',
    ('gae_ppo_libero.yaml', 'algorithm.clip_ratio_c'): 'policy_loss = -torch.min(ratio * advantage_clamp',
    ('gae_ppo_libero.yaml', 'algorithm.cliprange_value'): 'value_loss = nn.functional.mse_loss(values, retu',
    ('gae_ppo_libero.yaml', 'train.lr_warmup_steps'): 'self.actor_optimizer = optim.AdamW(actor_params,',
    ('gae_ppo_libero.yaml', 'train.weight_decay'): 'self.actor_optimizer = optim.AdamW(vla_trainable',
    ('gae_ppo_libero.yaml', 'train.ppo_micro_batch_size'): 'continue',
    ('gae_ppo_libero_pi0.yaml', 'env.task_ids'): 'specific_reset_id: null',
    ('gae_ppo_libero_pi0.yaml', 'env.pipeline'): 'total_num_envs: 64',
    ('gae_ppo_libero_pi0.yaml', 'init.mode'): 'model_path: "/path/to/model/RLinf-Pi0-LIBERO-Spa',
    ('gae_ppo_libero_pi0.yaml', 'policy.type'): '- model/pi0@actor.model',
    ('gae_ppo_libero_pi0.yaml', 'policy.preset'): 'config_name: "pi0_libero"',
    ('gae_ppo_libero_pi0.yaml', 'policy.bf16_weights'): 'mixed_precision:',
    ('gae_ppo_libero_pi0.yaml', 'algorithm.gae_unit'): 'reward_type: chunk_level',
    ('flowsar_libero.yaml', 'env.pipeline'): 'total_num_envs: 32',
    ('flowsar_libero.yaml', 'init.mode'): 'model_path: "/DATA/disk1/yjb/projects/VLA/FlowIP',
    ('flowsar_libero.yaml', 'policy.preset'): '- model/pi0@actor.model',
    ('flowsar_libero.yaml', 'policy.bf16_weights'): 'mixed_precision:',
    ('flowsar_libero.yaml', 'algorithm.flow_sar_ema_schedule'): 'flow_sar_ema_schedule: fixed',
    ('flowsar_libero_rlinf.yaml', 'env.pipeline'): 'total_num_envs: 32',
    ('flowsar_libero_rlinf.yaml', 'init.mode'): 'model_path: "/DATA/disk1/yjb/projects/VLA/FlowIP',
    ('flowsar_libero_rlinf.yaml', 'policy.preset'): '- model/pi0@actor.model',
    ('flowsar_libero_rlinf.yaml', 'policy.bf16_weights'): 'mixed_precision:',
    ('flowsar_libero_rlinf.yaml', 'algorithm.flow_sar_ema_schedule'): 'flow_sar_ema_schedule: fixed',
    ('flowsar_libero_rlinf.yaml', 'eval.every'): 'val_check_interval: -1',
    ('luffy_libero_cpu.yaml', 'env.suite'): 'DATASET_NAME="libero_10"',
    ('luffy_libero_cpu.yaml', 'env.fast_render'): 'env_args = {"bddl_file_name": task_bddl_file, "c',
    ('luffy_libero_cpu.yaml', 'env.num_envs'): 'actor_rollout_ref.rollout.micro_batch_size=1 \\',
    ('luffy_libero_cpu.yaml', 'env.pipeline'): 'actor_rollout_ref.rollout.micro_batch_size=1 \\',
    ('luffy_libero_cpu.yaml', 'init.mode'): 'actor_rollout_ref.model.path=$SFT_MODEL_PATH \\',
    ('luffy_libero_cpu.yaml', 'algorithm.filter_accuracy'): 'filter_accuracy: False',
    ('luffy_libero_cpu.yaml', 'train.lr_warmup_steps'): 'actor_rollout_ref.actor.optim.warmup_style=const',
    ('luffy_libero_cpu.yaml', 'train.mini_batch_unit'): 'self.config.actor.ppo_mini_batch_size *= self.co',
    ('luffy_libero_cpu.yaml', 'train.ppo_micro_batch_size'): 'actor_rollout_ref.actor.use_dynamic_bsz=True \\',
    ('luffy_libero_cpu.yaml', 'eval.trials_per_task'): 'data.val_batch_size=496 \\',
    ('luffy_libero_cpu.yaml', 'eval.samples_per_trial'): 'data.val_batch_size=496 \\',
    ('luffy_libero.yaml', 'env.suite'): 'DATASET_NAME="libero_10"',
    ('luffy_libero.yaml', 'env.task_ids'): 'data.num_trials_per_task=50 \\',
    ('luffy_libero.yaml', 'env.pipeline'): 'actor_rollout_ref.rollout.micro_batch_size=1 \\',
    ('luffy_libero.yaml', 'env.wrist_camera'): 'actor_rollout_ref.actor.num_images_in_input=1 \\',
    ('luffy_libero.yaml', 'init.mode'): 'actor_rollout_ref.model.path=$SFT_MODEL_PATH \\',
    ('luffy_libero.yaml', 'policy.type'): 'actor_rollout_ref.model.vla=$VLA_NAME \\',
    ('luffy_libero.yaml', 'policy.lora_rank'): 'actor_rollout_ref.model.path=$MODEL_PATH \\',
    ('luffy_libero.yaml', 'policy.image_pipeline'): 'actor_rollout_ref.rollout.center_crop=True \\',
    ('luffy_libero.yaml', 'algorithm.adv_estimator'): 'algorithm.adv_estimator=grpo \\',
    ('luffy_libero.yaml', 'algorithm.filter_accuracy'): 'filter_accuracy: False',
    ('luffy_libero.yaml', 'train.lr_warmup_steps'): 'actor_rollout_ref.actor.optim.warmup_style=const',
    ('luffy_libero.yaml', 'train.mini_batch_unit'): 'self.config.actor.ppo_mini_batch_size *= self.co',
    ('luffy_libero.yaml', 'train.ppo_micro_batch_size'): 'actor_rollout_ref.actor.use_dynamic_bsz=True \\',
    ('luffy_libero.yaml', 'eval.protocol'): 'data.val_batch_size=496 \\',
    ('srpo_libero_cpu.yaml', 'env.task_ids'): 'actor_rollout_ref.embodied.env.num_trials_per_ta',
    ('srpo_libero_cpu.yaml', 'env.pipeline'): 'export NUM_ENVS=16',
    ('srpo_libero_cpu.yaml', 'env.fast_render'): 'actor_rollout_ref.embodied.env.env_type=libero',
    ('srpo_libero_cpu.yaml', 'init.mode'): 'export MODEL_PATH=$HOME_PATH/models/Sylvest/Open',
    ('srpo_libero_cpu.yaml', 'rollout.refill'): 'algorithm.filter_groups.enable=True',
    ('srpo_libero_cpu.yaml', 'algorithm.loss_agg_mode'): 'response_mask_tmp_sum = response_mask_tmp.sum(ax',
    ('srpo_libero_cpu.yaml', 'train.lr_schedule'): 'warmup_style: str = field(default="constant", me',
    ('srpo_libero_cpu.yaml', 'train.mini_batch_unit'): 'dataloader = batch.split(self.config.ppo_mini_ba',
    ('srpo_libero_cpu.yaml', 'eval.samples_per_trial'): 'batch["do_sample"] = NonTensorData(False)',
    ('srpo_libero_grpo_cpu.yaml', 'env.pipeline'): 'export NUM_ENVS=16',
    ('srpo_libero_grpo_cpu.yaml', 'env.fast_render'): 'actor_rollout_ref.embodied.env.env_type=libero',
    ('srpo_libero_grpo_cpu.yaml', 'init.mode'): 'export MODEL_PATH=$HOME_PATH/models/Sylvest/Open',
    ('srpo_libero_grpo_cpu.yaml', 'rollout.refill'): 'algorithm.filter_groups.enable=True',
    ('srpo_libero_grpo_cpu.yaml', 'reward.mode'): "completes = data.batch['complete'].tolist()",
    ('srpo_libero_grpo_cpu.yaml', 'train.lr_schedule'): 'warmup_style: str = field(default="constant", me',
    ('srpo_libero_grpo_cpu.yaml', 'train.mini_batch_unit'): 'dataloader = batch.split(self.config.ppo_mini_ba',
    ('srpo_libero_grpo_cpu.yaml', 'eval.samples_per_trial'): 'batch["do_sample"] = NonTensorData(False)',
    ('gae_ppo_libero_cpu.yaml', 'env.pipeline'): 'num_envs: int = 1',
    ('gae_ppo_libero_cpu.yaml', 'env.fast_render'): 'env_args = {"bddl_file_name": task_bddl_file, "c',
    ('gae_ppo_libero_cpu.yaml', 'init.mode'): 'vla_config = OpenVLAActorConfig(',
    ('gae_ppo_libero_cpu.yaml', 'algorithm.ratio_unit'): 'log_prob = log_prob.mean()',
    ('gae_ppo_libero_cpu.yaml', 'algorithm.gae_unit'): 'should_add_chunk = (self.chunk_step_count == 8) ',
    ('gae_ppo_libero_cpu.yaml', 'algorithm.clip_ratio_c'): 'policy_loss = -torch.min(ratio * advantage_clamp',
    ('gae_ppo_libero_cpu.yaml', 'algorithm.cliprange_value'): 'value_loss = nn.functional.mse_loss(values, retu',
    ('gae_ppo_libero_cpu.yaml', 'train.lr_warmup_steps'): 'self.actor_optimizer = optim.AdamW(actor_params,',
    ('gae_ppo_libero_cpu.yaml', 'train.weight_decay'): 'self.actor_optimizer = optim.AdamW(vla_trainable',
    ('gae_ppo_libero_cpu.yaml', 'train.ppo_micro_batch_size'): 'continue',
    ('gae_ppo_libero_cpu.yaml', 'eval.samples_per_trial'): 'eval_temperature: float = 0.0',

}
CITE = re.compile(r"(?:(siiRL|SimpleVLA-RL|OpenVLA-OFT-RL|RLinf|FlowIPO|LUFFY|openvla-oft)\s+)?"
                  r"((?:SVLA script|script|start|quickstart|train\.sh|[\w./-]+\.\w+)):(\d+(?:[-,] ?\d+)*)(?:@(\w+))?")
NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:e[-+]?\d+)?(?![\w.]*[a-df-z])", re.I)
IDENT = re.compile(r"\b[A-Za-z]\w*_\w+\b")


def rows() -> List[Tuple[str, str, str, str]]:
    """(config, key or first cell, reference cell, source cell) of every table row under a `configs/...` heading."""
    out, current = [], None
    with open(RECIPES, encoding="utf-8") as f:
        for line in f:
            heading = re.match(r"#{2,3} .*?`configs/([\w.]+\.yaml)`", line)
            if heading and line.count("`configs/") == 1:
                current = heading.group(1)
                continue
            if line.startswith("#"):
                current = None
            if current is None or not line.startswith("| ") or line.startswith(("| key ", "|---", "| |")):
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 5:
                out.append((current, cells[0].strip("`"), cells[2], cells[3]))
    return out


def citations(source: str) -> List[Tuple[str, str, List[int], str]]:
    """(reference, path as cited, lines, commit) of a source cell; a citation without a reference name takes the
    previous one's (`siiRL script:50-52@af00a77; siirl/engine/fsdp_workers.py:212@af00a77`)."""
    out, ref = [], None
    for m in CITE.finditer(source):
        ref = m.group(1) or ref
        if ref is None:
            continue
        lines: List[int] = []
        for part in m.group(3).replace(" ", "").split(","):
            a, _, b = part.partition("-")
            lines += list(range(int(a), int(b or a) + 1))
        out.append((ref, m.group(2), lines, m.group(4) or REFERENCES[ref][1]))
    return out


class Checkout:
    """A reference's git repository (any clone or mirror holding the pinned commit): files read with git show."""

    def __init__(self, path: str):
        self.path = path
        self._trees: Dict[str, List[str]] = {}

    def git(self, *args: str) -> Optional[str]:
        out = subprocess.run(["git", "-C", self.path, *args], capture_output=True, text=True, errors="replace")
        return out.stdout if out.returncode == 0 else None

    def resolve(self, ref: str, cited: str, commit: str) -> Optional[str]:
        """The path a cited name stands for at `commit`: a table short name, the path itself, or the one file whose
        path ends with it."""
        if (ref, cited) in SHORT:
            return SHORT[ref, cited]
        if commit not in self._trees:
            self._trees[commit] = (self.git("ls-tree", "-r", "--name-only", commit) or "").splitlines()
        tree = self._trees[commit]
        if cited in tree:
            return cited
        ends = [p for p in tree if p.endswith("/" + cited)]
        if not ends and "/" not in cited:  # a bare file name cited after its folder (mix_fsdp_worker.py)
            ends = [p for p in tree if os.path.basename(p) == cited]
        return ends[0] if len(ends) == 1 else None

    def lines(self, path: str, commit: str, numbers: List[int]) -> Optional[str]:
        text = self.git("show", f"{commit}:{path}")
        if text is None:
            return None
        all_lines = text.splitlines()
        return "\n".join(all_lines[n - 1] for n in numbers if 0 < n <= len(all_lines))


def literals(cell: str) -> Tuple[List[float], List[str]]:
    """The numbers and identifiers a reference cell names (what its cited line should hold)."""
    words = re.sub(r"`", "", cell)
    numbers = []
    for m in NUMBER.finditer(words):
        try:
            numbers.append(float(m.group(0)))
        except ValueError:
            pass
    idents = IDENT.findall(words) + [w for w in ("True", "False", "true", "false") if re.search(rf"\b{w}\b", words)]
    return numbers, idents


def holds(text: str, numbers: List[float], idents: List[str], expect: Optional[str]) -> bool:
    if expect is not None:
        return expect in text
    found = set()
    for m in NUMBER.finditer(text):
        try:
            found.add(float(m.group(0)))
        except ValueError:
            pass
    return any(n in found for n in numbers) or any(i.lower() in text.lower() for i in idents)


def check(checkouts: Dict[str, Checkout]) -> List[Tuple[str, str, str, str]]:
    """(status, config, key, detail) of every row."""
    out = []
    for config, key, reference, source in rows():
        cites = citations(source)
        if not cites:
            out.append(("words", config, key, f"no reference file:line in {source!r}"))
            continue
        texts, missing = [], []
        for ref, cited, numbers, commit in cites:
            if ref not in checkouts:
                missing.append(ref)
                continue
            path = checkouts[ref].resolve(ref, cited, commit)
            text = checkouts[ref].lines(path, commit, numbers) if path else None
            if text is None:
                texts.append(("", f"{ref} {cited}@{commit}: not found"))
            else:
                texts.append((text, f"{ref} {path}:{numbers[0]}-{numbers[-1]}@{commit}"))
        if missing and not texts:
            out.append(("no-ref", config, key, ", ".join(sorted(set(missing)))))
            continue
        numbers, idents = literals(reference)
        expect = EXPECT.get((config, key))
        if expect is None and not numbers and not idents:
            out.append(("words", config, key, "; ".join(w for _, w in texts)))
            continue
        ok = any(holds(t, numbers, idents, expect) for t, _ in texts)
        detail = "; ".join(w for _, w in texts) + ("" if ok else f" | wanted {expect or (numbers + idents)}")
        out.append(("ok" if ok else "MISS", config, key, detail))
    return out


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mirror-root", default=None, help="a folder of <owner>+<name>/repo (or <name>) git checkouts")
    p.add_argument("--ref", action="append", default=[], help="NAME=PATH: a reference's checkout (NAME as the "
                   f"tables spell it: {', '.join(REFERENCES)})")
    p.add_argument("--only", default=None, help="print only rows of this status (ok, MISS, words, no-ref)")
    args = p.parse_args(argv)
    checkouts: Dict[str, Checkout] = {}
    for name, (repo, _) in REFERENCES.items():
        if args.mirror_root:
            for folder in (repo.replace("/", "+") + "/repo", repo.replace("/", "+"), repo.split("/")[1]):
                path = os.path.join(os.path.expanduser(args.mirror_root), folder)
                if os.path.isdir(path):
                    checkouts[name] = Checkout(path)
                    break
    for item in args.ref:
        name, _, path = item.partition("=")
        if name not in REFERENCES:
            raise SystemExit(f"error: --ref {item}: unknown reference {name!r}; use one of {', '.join(REFERENCES)}")
        checkouts[name] = Checkout(os.path.expanduser(path))
    if not checkouts:
        raise SystemExit("error: give --mirror-root or --ref NAME=PATH (the references' git checkouts)")
    results = check(checkouts)
    counts: Dict[str, int] = {}
    for status, config, key, detail in results:
        counts[status] = counts.get(status, 0) + 1
        if args.only in (None, status):
            print(f"{status:6} {config:28} {key:40} {detail}")
    print("rows: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + f" (of {len(results)})")
    return 1 if counts.get("MISS") else 0


if __name__ == "__main__":
    sys.exit(main())
