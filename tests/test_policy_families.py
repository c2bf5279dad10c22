"""Policy families own their knowledge (models/policy.py PolicyFamily): a new family is one module plus one row in
FAMILIES, and the scripts run it without a change. Proved with two toy fifth families written into temporary modules,
a token-like one and a flow-like one: train_sft.py and the RL script plan their memory (--dry-run, from the family's
own memory_model), train_sft.py trains it from its own section, the RL script (SRPO, GAE-PPO) trains that SFT start
for one iteration and evaluate.py scores the checkpoint it saved; the families' rows are added by a launcher (as a
user's own module would add them), touching no file of the project."""
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


class ToyFolder:
    """A toy policy's folder (state dict, config, action stats) and its lack of LoRA: shared by both toy families."""

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
            policy = cls(cls.config_class(**json.load(f)), ActionTokenizer.load(path))
        policy.load_state_dict(torch.load(os.path.join(path, "model.pt"), map_location=device))
        return policy.to(device)


class ToyPolicy(ToyFolder, nn.Module, PolicyFamily):
    config_class = ToyConfig

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

TOY_FLOW_MODULE = '''
"""A toy flow family: a sample starts from Gaussian noise x (chunk x 7, the normalised action space) and takes
`num_steps` Euler steps of the velocity v(x | obs) = x - mu(obs) (mu: a linear function of the agent view's mean
colour); with noise level s > 0 one random step is an SDE step, Gaussian around the Euler step with std s / sqrt(N).
Enough of the flow-family interface for SFT (flow matching), GAE-PPO (that step's log-density) and evaluation."""
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from models.action_tokenizer import ACTION_DIM, ActionTokenizer
from models.policy import PolicyFamily
from toy_family import ToyFolder  # the other toy module: its folder format


@dataclass
class ToyFlowConfig:
    type: str = "toy_flow"
    image_size: int = 64
    action_chunk: int = 8
    n_bins: int = 16  # the ActionTokenizer's: its statistics normalise the actions
    num_steps: int = 2
    noise_method: str = "flow_sde"  # what GAE-PPO asks of a flow policy
    use_wrist: bool = False
    lora_rank: int = 0
    lora_alpha: int = 16
    lora_dropout: float = 0.0


class ToyFlowPolicy(ToyFolder, nn.Module, PolicyFamily):
    config_class = ToyFlowConfig

    def __init__(self, cfg=None, action_tokenizer=None):
        super().__init__()
        self.cfg = cfg or ToyFlowConfig()
        self.action_chunk = self.cfg.action_chunk
        self.action_tokenizer = action_tokenizer or ActionTokenizer(-np.ones(ACTION_DIM), np.ones(ACTION_DIM),
                                                                    self.cfg.n_bins)
        self.mu = nn.Linear(3, self.action_chunk * ACTION_DIM)
        self.hidden_size = 3

    @property
    def device(self):
        return self.mu.weight.device

    def hidden(self, obs, instructions=None):
        view = torch.as_tensor(np.asarray(obs["agentview"]), dtype=torch.float32, device=self.device) / 255.0
        return view.mean(dim=(1, 2))

    def velocity(self, x, hidden):
        return x - self.mu(hidden).view(len(hidden), self.action_chunk, ACTION_DIM)

    def step(self, x, hidden, num_steps, noise_level):
        """The Euler step's mean and the SDE step's std."""
        return x - self.velocity(x, hidden) / num_steps, noise_level / math.sqrt(num_steps)

    def rollout_step(self, obs, instructions, *, generators=None, flow_steps=None, flow_noise_level=0.0,
                     keep_hidden=False, keep_chain=False, **_):
        n = flow_steps or self.cfg.num_steps
        with torch.no_grad():
            hidden = self.hidden(obs)
            shape = (len(hidden), self.action_chunk, ACTION_DIM)

            def draw():
                if generators is None:
                    return torch.randn(shape)
                return torch.stack([torch.randn(shape[1:], generator=g) for g in generators])

            x = noise = draw()
            sde, chain = (int(torch.randint(n, ())) if flow_noise_level > 0 else -1), {}
            for i in range(n):
                mean, std = self.step(x, hidden, n, flow_noise_level)
                x_t, x = x, (mean + std * draw() if i == sde else mean)
                if i == sde:
                    log_prob = torch.distributions.Normal(mean, std).log_prob(x).sum((1, 2))
                    chain = dict(sde_step=np.full(len(x), i), x_t=x_t.numpy(), x_next=x.numpy(),
                                 old_log_probs=log_prob[:, None].numpy())
        record = {"noise": noise.numpy(), **(chain if keep_chain else {})}
        if keep_hidden:
            record["hidden"] = hidden.numpy()
        return self.action_tokenizer.unnormalize(x), record

    def ppo_log_prob(self, obs, instructions, record, *, temperature=1.0, noise_level=0.0, executed=None):
        """The rollout's SDE step's log-density (B, 1) over the executed actions, no entropy, the hidden features."""
        hidden = self.hidden(obs)
        mean, std = self.step(record("x_t", self.device), hidden, self.cfg.num_steps, noise_level)
        terms = torch.distributions.Normal(mean, std).log_prob(record("x_next", self.device))
        if executed is not None:  # only the actions the env ran
            ran = torch.arange(self.action_chunk)[None, :] < torch.as_tensor(executed).reshape(-1, 1)
            terms = terms * ran[:, :, None].to(terms)
        return terms.sum((1, 2))[:, None], None, hidden

    def sft_loss(self, obs, instructions, actions):
        a = self.action_tokenizer.normalize(actions).to(self.device)
        eps, t = torch.randn_like(a), torch.rand(len(a), 1, 1, device=self.device)
        loss = ((self.velocity((1 - t) * a + t * eps, self.hidden(obs)) - (eps - a)) ** 2).mean()
        return loss, {"sft/flow_mse": float(loss)}

    @classmethod
    def memory_model(cls, policy_cfg, folder):
        from models.memory import Model, Stack

        with torch.device("meta"):
            policy = cls(policy_cfg)
        return Model("toy_flow", policy, [Stack("mean head", "mlp", 1, 3, policy.action_chunk * ACTION_DIM, tokens=1)],
                     hidden_size=3)
'''

LAUNCHER = '''
"""python launch.py <folder of the toy modules> '<JSON list of command lines>': the toy families' rows added to
FAMILIES (as a user's own module would add them), then each script run in turn in this process, as
`python script args` runs it."""
import json
import os
import runpy
import sys

sys.path.insert(0, sys.argv[1])
from models.configs import FAMILIES
import toy_family
import toy_flow_family

FAMILIES["toy"] = ("toy_family", "ToyPolicy", toy_family.ToyConfig, "token")  # each family's one table row
FAMILIES["toy_flow"] = ("toy_flow_family", "ToyFlowPolicy", toy_flow_family.ToyFlowConfig, "flow")
for command in json.loads(sys.argv[2]):
    print(f"[launch] {command[0]}", flush=True)
    sys.argv = command
    try:
        runpy.run_path(command[0], run_name="__main__")
    except SystemExit as e:  # --dry-run exits 0
        if e.code not in (0, None):
            raise
'''


def _write_toy(tmp_path):
    (tmp_path / "toy_family.py").write_text(textwrap.dedent(TOY_MODULE))
    (tmp_path / "toy_flow_family.py").write_text(textwrap.dedent(TOY_FLOW_MODULE))
    (tmp_path / "launch.py").write_text(textwrap.dedent(LAUNCHER))


def _launch(tmp_path, *commands, timeout=300):
    """The command lines (script, args...) run in turn by the launcher in one process: each one's printed lines."""
    commands = [[os.path.join(ROOT, c[0]), *c[1:]] for c in commands]
    out = subprocess.run([sys.executable, str(tmp_path / "launch.py"), str(tmp_path), json.dumps(commands)], cwd=ROOT,
                         env=ENV, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return [part.splitlines()[1:] for part in out.stdout.split("[launch] ")[1:]]


def test_a_fifth_family_owns_its_memory_plan(tmp_path, monkeypatch, capsys):
    """The toy family's own `memory_model` is all the plan needs: its bytes, hand-computed (16 bins x 8 steps x 7
    dims = 896 logits: bias 896 + colour Linear 3 x 896 + 896 = 4,480 float32 parameters in 3 tensors); without a
    `memory_model` (PolicyFamily's default) --dry-run answers in one line and exits 0. No file of the project is
    touched."""
    import importlib

    from common import memory_plan
    from common.config import load_config
    from common.memory_plan import KAPPA, plan_run

    _write_toy(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    toy = importlib.import_module("toy_family")
    monkeypatch.setitem(FAMILIES, "toy", ("toy_family", "ToyPolicy", toy.ToyConfig, "token"))
    cfg = load_config(importlib.import_module("train_srpo").Config, None,
                      ["env.task_ids=[0]", "policy.type=toy", "policy.n_bins=16", "init.mode=scratch",
                       "reward.mode=binary", "train.micro_batch_size=4", "train.mini_batch_size=8"])
    plan = plan_run(cfg, 1)
    assert plan.parts["weights"] == plan.parts["gradients"] == 4 * 4480
    assert plan.parts["adamw"] == 2 * 4 * 4480 + 4 * 3  # two float32 moments + a 4-byte step per tensor
    assert plan.parts["autocast"] == 2 * (3 * 896 + 896)  # bf16 copies of the trainable Linear's weight and bias
    assert plan.parts["activations"] == int(4 * 2 * (3 + 2 * 896) * KAPPA)  # micro 4 x bf16 (input + 2 x 896)
    assert plan.title.startswith("train_srpo.py: toy, full fine-tuning; ddp over 1 process; micro-batch 4 of 8")

    monkeypatch.delattr(toy.ToyPolicy, "memory_model")  # --dry-run (each script's main calls it) without a plan
    monkeypatch.setattr(memory_plan, "CLI", {"dry_run": True, "device_memory_gib": 80.0, "processes": None})
    with pytest.raises(SystemExit) as e:
        memory_plan.dry_run(cfg)
    assert e.value.code == 0
    assert capsys.readouterr().out.splitlines() == [
        "[memory plan] no plan for policy family 'toy': its class's memory_model gives none (models/memory.py says "
        "what one returns); nothing checked against the device"]
    assert not os.path.exists(os.path.join(ROOT, "toy_family.py"))


def test_train_sft_takes_a_new_familys_own_section(tmp_path, monkeypatch):
    """train_sft.py's `policy` holds a section per family: policy.type=toy adds the toy's (its config class's keys and
    defaults) beside token and flow; a start from a folder (policy.init_path) takes that folder's config, no section."""
    import importlib

    import train_sft
    from common.config import ConfigError, load_config

    _write_toy(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    toy = importlib.import_module("toy_family")
    monkeypatch.setitem(FAMILIES, "toy", ("toy_family", "ToyPolicy", toy.ToyConfig, "token"))
    cfg = load_config(train_sft.Config, None, ["policy.type=toy", "policy.toy.n_bins=32"])
    assert cfg.policy.toy == toy.ToyConfig(n_bins=32) and cfg.policy.token.hidden_size == 256
    assert [type(s).__name__ for s in train_sft.family_sections(cfg.policy)] == \
        ["TokenPolicyConfig", "FlowPolicyConfig", "ToyConfig"]
    cfg = load_config(train_sft.Config, None, ["policy.type=toy", "policy.init_path=somewhere"])
    assert not hasattr(cfg.policy, "toy")
    with pytest.raises(ConfigError, match="unknown key 'policy.toy'"):
        load_config(train_sft.Config, None, ["policy.toy.n_bins=32"])  # policy.type=token: no toy section


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


TINY = ["--task-id", "0", "--no-wandb", "env.num_envs=2", "env.max_steps=8"]  # one thread: ENV


def sft_args(tmp_path, family):
    """train_sft.py's tiniest run of `family` (its own section policy.<family>): 1 demo, 2 steps, 1 held-out trial."""
    return ["train_sft.py", *TINY, f"policy.type={family}", f"policy.{family}.n_bins=16", "sft.num_demos=1",
            "sft.steps=2", "sft.log_every=2", "sft.batch_size=4", "sft.eval_trials=1", "log.run_name=sft",
            f"sft.output_path={tmp_path}/{family}_sft", f"log.output_dir={tmp_path}/runs",
            f"log.plots_dir={tmp_path}/plots"]


def rl_args(tmp_path, script, family, *extra):
    """One RL iteration of `script` from the family's SFT start, 2 episodes, no evaluation."""
    return [script, *TINY, f"policy.type={family}", "policy.n_bins=16", "init.mode=checkpoint",
            f"init.path={tmp_path}/{family}_sft", "train.iterations=1", "eval.every=0", "log.run_name=rl",
            f"log.output_dir={tmp_path}/runs", f"log.plots_dir={tmp_path}/plots", *extra]


def evaluate_args(tmp_path):
    return ["evaluate.py", "--checkpoint", f"{tmp_path}/runs/rl/checkpoints/iter_000001", "--trials", "1",
            "--max-steps", "8", "--gifs", "0", "--out-dir", f"{tmp_path}/eval"]


@pytest.mark.parametrize("family, script, extra", [
    ("toy", "train_srpo.py", ["reward.mode=binary", "rollout.n=2", "rollout.prompts_per_iteration=1",
                              "algorithm.filter_accuracy=false", "algorithm.entropy_coeff=0.01"]),
    ("toy_flow", "train_gae_ppo.py", ["rollout.prompts_per_iteration=2", "train.lr_warmup_steps=0"]),
])
def test_a_fifth_family_is_one_module_and_one_row(tmp_path, family, script, extra):
    """A toy token-like family (SRPO) and a toy flow-like one (GAE-PPO), each one module plus its FAMILIES row added by
    the launcher, touching no file of the project: train_sft.py plans its memory (--dry-run) and trains it from its
    own section (policy.<family>: the family's `fresh` start and `sft_loss`), the RL script plans (--dry-run) and
    trains it one iteration from that SFT start, and evaluate.py scores the RL checkpoint."""
    _write_toy(tmp_path)
    sft, rl = sft_args(tmp_path, family), rl_args(tmp_path, script, family, *extra)
    plans = _launch(tmp_path, [*sft, "--dry-run"], [*rl, "--dry-run"], sft, rl, evaluate_args(tmp_path))[:2]
    for lines, name in zip(plans, ("train_sft.py", script)):
        assert lines[0].startswith(f"[memory plan] {name}: {family}, full fine-tuning; ddp"), lines
        assert any(line.strip().startswith("peak (") for line in lines), lines

    with open(tmp_path / f"{family}_sft" / "config.json") as f:
        assert json.load(f)["type"] == family
    rows = [json.loads(line) for line in open(tmp_path / "runs" / "sft" / "metrics.jsonl")]
    assert rows[-1]["train/grad_norm"] > 0  # the family's own SFT loss trained it
    with open(tmp_path / "runs" / "rl" / "checkpoints" / "iter_000001" / "policy" / "config.json") as f:
        assert json.load(f)["type"] == family
    rows = [json.loads(line) for line in open(tmp_path / "runs" / "rl" / "metrics.jsonl")]
    assert [r["iteration"] for r in rows] == [1] and rows[0]["train/grad_norm"] > 0  # it trained
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["policy_type"] == family and results["trial_ids"] == [30]
    assert not os.path.exists(os.path.join(ROOT, "toy_family.py"))
