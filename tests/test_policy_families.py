"""Policy families own their knowledge (models/policy.py PolicyFamily): a new family is one module plus one row in
FAMILIES, and the scripts run it without a change. Proved with a toy fifth family written into a temporary module:
train_srpo.py trains it from scratch for one iteration and evaluate.py scores the checkpoint it saved; the family's
row is added by a launcher (as a user's own module would add it), touching no file of the project."""
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
'''

LAUNCHER = '''
import runpy
import sys

sys.path.insert(0, sys.argv[1])
from models.configs import FAMILIES
import toy_family

FAMILIES["toy"] = ("toy_family", "ToyPolicy", toy_family.ToyConfig, "token")  # the family's one table row
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


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
    (tmp_path / "toy_family.py").write_text(textwrap.dedent(TOY_MODULE))
    (tmp_path / "launch.py").write_text(textwrap.dedent(LAUNCHER))

    def launch(script, *args):
        out = subprocess.run([sys.executable, str(tmp_path / "launch.py"), str(tmp_path), os.path.join(ROOT, script),
                              *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
        return out

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
