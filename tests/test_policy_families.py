"""Policy families own their knowledge (models/policy.py PolicyFamily): a new family is one module plus one row in
FAMILIES, and the scripts run it without a change. Proved with a toy fifth family written into a temporary module:
train_srpo.py plans its memory (--dry-run, from the family's own memory_model), trains it from scratch for one iteration
and evaluate.py scores the checkpoint it saved; the family's row is added by a launcher (as a user's own module would
add it), touching no file of the project."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from models.configs import FAMILIES
from models.policy import PolicyFamily, family_of_folder, policy_class

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", WANDB_MODE="disabled")

TOY_MODULE = '''
"""A toy token family: each of the chunk x 7 action slots is a categorical over the bins, its logits a bias plus a
linear function of the agent view's mean colour. Enough of the token-family interface for SRPO and evaluation."""
import dataclasses
import json
import os
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from models.action_tokenizer import ACTION_DIM, ActionTokenizer
from models.policy import PolicyFamily


@dataclass
class ToyConfig:
    type: str = "toy"
    image_size: int = 64
    action_chunk: int = 8
    n_bins: int = 16
    use_wrist: bool = False
    lora_rank: int = 0
    lora_alpha: int = 16
    lora_dropout: float = 0.0


class ToyPolicy(nn.Module, PolicyFamily):
    config_class = ToyConfig
    kind = "token"

    def __init__(self, cfg=None, action_tokenizer=None):
        super().__init__()
        self.cfg = cfg or ToyConfig()
        self.action_chunk = self.cfg.action_chunk
        self.action_tokenizer = action_tokenizer or ActionTokenizer(-np.ones(ACTION_DIM), np.ones(ACTION_DIM),
                                                                    self.cfg.n_bins)
        slots = self.action_chunk * ACTION_DIM
        self.bias = nn.Parameter(torch.zeros(slots, self.cfg.n_bins))
        self.colour = nn.Linear(3, slots * self.cfg.n_bins)
        self.hidden_size = 3

    @property
    def device(self):
        return self.bias.device

    def _logits(self, obs):
        view = torch.as_tensor(np.asarray(obs["agentview"]), dtype=torch.float32, device=self.device) / 255.0
        colour = view.mean(dim=(1, 2))
        return self.bias + self.colour(colour).view(len(view), *self.bias.shape), colour

    def act(self, obs, instructions=None, temperature=1.0, greedy=False, return_hidden=False, generators=None):
        logits, colour = self._logits(obs)
        logp = torch.log_softmax(logits / temperature, -1)
        if greedy:
            tokens = logp.argmax(-1)
        else:
            tokens = torch.stack([torch.multinomial(p.exp(), 1, generator=None if generators is None else g)[:, 0]
                                  for p, g in zip(logp, generators or [None] * len(logp))])
        actions = self.action_tokenizer.decode(tokens.view(len(tokens), self.action_chunk, ACTION_DIM).cpu())
        out = (torch.as_tensor(actions), tokens, logp.gather(-1, tokens[..., None])[..., 0])
        return out + (colour,) if return_hidden else out

    def log_prob(self, obs, instructions, tokens, temperature=1.0, return_hidden=False):
        logits, colour = self._logits(obs)
        logp = torch.log_softmax(logits / temperature, -1)
        tokens = torch.as_tensor(tokens, device=self.device).view(len(logp), -1)
        entropy = -(logp.exp() * logp).sum(-1)
        out = (logp.gather(-1, tokens[..., None])[..., 0], entropy)
        return out + (colour,) if return_hidden else out

    def hidden(self, obs, instructions=None):
        return self._logits(obs)[1]

    def sft_loss(self, obs, instructions, actions):
        tokens = self.action_tokenizer.encode(actions).view(len(actions), -1)
        logp, _ = self.log_prob(obs, instructions, tokens)
        return -logp.mean(), {"sft/loss": float(-logp.mean())}

    def reference(self):
        raise ValueError("the toy family has no LoRA")

    def set_lora_rank(self, lora_rank):
        if lora_rank:
            raise ValueError("the toy family has no LoRA")

    def save(self, path):
        os.makedirs(path, exist_ok=True)
        torch.save(self.state_dict(), os.path.join(path, "model.pt"))
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(dataclasses.asdict(self.cfg), f)
        open(os.path.join(path, "model.safetensors"), "w").close()  # what a policy folder is recognised by
        self.action_tokenizer.save(os.path.join(path, "action_stats.json"))

    @classmethod
    def load(cls, path, lora_rank=None, device="cpu"):
        with open(os.path.join(path, "config.json")) as f:
            policy = cls(ToyConfig(**json.load(f)), ActionTokenizer.load(path))
        policy.load_state_dict(torch.load(os.path.join(path, "model.pt"), map_location=device))
        return policy.to(device)

    @classmethod
    def memory_model(cls, policy_cfg, folder):
        """The memory plan's view: the policy on the meta device, one MLP-like stack (3 colour inputs -> the slots'
        logits) per sample."""
        from models.memory import Model, Stack

        with torch.device("meta"):
            policy = cls(policy_cfg)
        slots = policy.action_chunk * ACTION_DIM * policy.cfg.n_bins
        return Model("toy", policy, [Stack("colour head", "mlp", 1, 3, slots, tokens=1)], hidden_size=3)
'''

LAUNCHER = '''
import os
import runpy
import sys

sys.path.insert(0, sys.argv[1])
from models.configs import FAMILIES
import toy_family

FAMILIES["toy"] = ("toy_family", "ToyPolicy", toy_family.ToyConfig, "token")  # the family's one table row
if os.environ.get("TOY_PLAN") == "0":  # the same family giving no memory plan (PolicyFamily's default)
    del toy_family.ToyPolicy.memory_model
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def _write_toy(tmp_path):
    (tmp_path / "toy_family.py").write_text(textwrap.dedent(TOY_MODULE))
    (tmp_path / "launch.py").write_text(textwrap.dedent(LAUNCHER))


def _launch(tmp_path, script, *args, env=ENV, timeout=900):
    out = subprocess.run([sys.executable, str(tmp_path / "launch.py"), str(tmp_path), os.path.join(ROOT, script),
                          *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out


def test_a_fifth_family_owns_its_memory_plan(tmp_path, monkeypatch):
    """The toy family's own `memory_model` is all the plan needs: its bytes, hand-computed (16 bins x 8 steps x 7
    dims = 896 logits: bias 896 + colour Linear 3 x 896 + 896 = 4,480 float32 parameters in 3 tensors), and
    `--dry-run` prints its table and exits 0; without a `memory_model` (PolicyFamily's default) --dry-run answers
    in one line and exits 0. No file of the project is touched."""
    import importlib

    from common.config import load_config
    from common.memory_plan import KAPPA, plan_run

    _write_toy(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    toy = importlib.import_module("toy_family")
    monkeypatch.setitem(FAMILIES, "toy", ("toy_family", "ToyPolicy", toy.ToyConfig, "token"))
    cfg = load_config(importlib.import_module("train_srpo").Config, None,
                      ["env.task_ids=[0]", "policy.type=toy", "policy.n_bins=16", "init.mode=scratch",
                       "reward.mode=binary", "train.ppo_micro_batch_size=4", "train.ppo_mini_batch_size=8"])
    plan = plan_run(cfg, "srpo", 1)
    assert plan.parts["weights"] == plan.parts["gradients"] == 4 * 4480
    assert plan.parts["adamw"] == 2 * 4 * 4480 + 4 * 3  # two float32 moments + a 4-byte step per tensor
    assert plan.parts["autocast"] == 2 * (3 * 896 + 896)  # bf16 copies of the trainable Linear's weight and bias
    assert plan.parts["activations"] == int(4 * 2 * (3 + 2 * 896) * KAPPA)  # micro 4 x bf16 (input + 2 x 896)
    assert plan.title.startswith("train_srpo.py: toy, full fine-tuning; ddp over 1 process; micro-batch 4 of 8")

    args = ["--task-id", "0", "--dry-run", "--device-memory-gib", "80", "policy.type=toy", "policy.n_bins=16",
            "init.mode=scratch", "reward.mode=binary"]
    lines = _launch(tmp_path, "train_srpo.py", *args, timeout=120).stdout.splitlines()
    assert lines[0].startswith("[memory plan] train_srpo.py: toy, full fine-tuning; ddp"), lines
    assert any(line.strip().startswith("peak (") and "of 80.0 GiB" in line and ": fits" in line for line in lines)
    out = _launch(tmp_path, "train_srpo.py", *args, env=dict(ENV, TOY_PLAN="0"), timeout=120)
    assert out.stdout.splitlines() == ["[memory plan] no plan for policy family 'toy': its class's memory_model "
                                       "gives none (models/memory.py says what one returns); nothing checked "
                                       "against the device"]
    assert not os.path.exists(os.path.join(ROOT, "toy_family.py"))


def test_every_family_tells_its_kind_and_recognises_only_its_own_folders(tmp_path):
    """The table's kind is the class's; each family's `detect` is exclusive on the shipped fixtures."""
    for family, (_, _, _, kind) in FAMILIES.items():
        cls = policy_class(family)
        assert issubclass(cls, PolicyFamily) and cls.kind == kind and cls.family() == family
    fixtures = {"tabletop_t0_weak": "token", "tiny_openvla_oft": "openvla_oft", "tiny_openvla_oft_l1": "openvla_oft_l1",
                "tiny_pi0_openpi": "flow"}
    for folder, family in fixtures.items():
        path = os.path.join(ROOT, "tests", "fixtures", folder)
        assert [f for f in FAMILIES if policy_class(f).detect(path)] == [family], folder
        assert family_of_folder(path) == family


@pytest.mark.slow
def test_a_fifth_family_is_one_module_and_one_row(tmp_path):
    _write_toy(tmp_path)

    def launch(script, *args):
        return _launch(tmp_path, script, *args)

    launch("train_srpo.py", "--task-id", "0", "--no-wandb", "policy.type=toy", "policy.n_bins=16", "init.mode=scratch",
           "env.num_envs=4", "env.max_steps=16", "rollout.n=2", "rollout.prompts_per_iteration=2",
           "algorithm.filter_accuracy=false", "algorithm.entropy_coeff=0.01", "reward.mode=binary", "train.iterations=1",
           "eval.trials_per_task=2",
           "eval.samples_per_trial=0", f"log.output_dir={tmp_path}/runs", f"log.plots_dir={tmp_path}/plots")
    (run,) = os.listdir(tmp_path / "runs")
    checkpoint = tmp_path / "runs" / run / "checkpoints" / "iter_000001"
    with open(checkpoint / "policy" / "config.json") as f:
        assert json.load(f)["type"] == "toy"
    rows = [json.loads(line) for line in open(tmp_path / "runs" / run / "metrics.jsonl")]
    assert [r["iteration"] for r in rows] == [0, 1] and rows[1]["train/grad_norm"] > 0  # it trained (entropy bonus)

    launch("evaluate.py", "--checkpoint", str(checkpoint), "--trials", "2", "--max-steps", "16", "--gifs", "0",
           "--out-dir", str(tmp_path / "eval"))
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["policy_type"] == "toy" and results["trial_ids"] == [30, 31]
