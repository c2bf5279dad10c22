"""OpenVLA-OFT L1-regression checkpoints (models/openvla_oft_l1.py): detected by their action head file, loaded
strictly, actions equal to openvla-oft's own predict_action (L1 head + proprio projector, 2 images) on the tiny fixture,
normalisation by hand, SFT with the L1 loss, save / reload, evaluate.py and train_sft.py on the folder, and every RL
script refusing it in one line.

The golden numbers (tests/fixtures/tiny_openvla_oft_l1_golden.json) come from running openvla-oft's
OpenVLAForActionPrediction.predict_action (transformers fork 4.40.1, timm 0.9.10, fp32) with its
L1RegressionActionHead and ProprioProjector loaded by its load_component_state_dict, the proprio normalised by its
normalize_proprio and the gripper converted by robot_utils' normalize_gripper_action + invert_gripper_action, on
tests/fixtures/tiny_openvla_oft_l1 (vision_backbone.set_num_images_in_input(2): agentview then wrist).
"""
import json
import os

import numpy as np
import pytest
import torch

from models.openvla_oft_l1 import OpenVLAOFTL1Config, OpenVLAOFTL1Policy
from models.saved import no_rl_message
from models.policy import action_kind, family_of_folder
from models.saved import PolicyLoadError
from tests.scripts import ROOT, golden_image, read_metrics, run_script

FIXTURES = os.path.join(ROOT, "tests", "fixtures")
L1 = os.path.join(FIXTURES, "tiny_openvla_oft_l1")
DISCRETE = os.path.join(FIXTURES, "tiny_openvla_oft")
HEAD, PROPRIO = "action_head--150000_checkpoint.pt", "proprio_projector--150000_checkpoint.pt"


@pytest.fixture(scope="module")
def golden():
    with open(os.path.join(FIXTURES, "tiny_openvla_oft_l1_golden.json")) as f:
        return json.load(f)["cases"]


@pytest.fixture(scope="module")
def policy():
    return OpenVLAOFTL1Policy.load(L1).eval()


def _obs(cases):
    return {"agentview": np.stack([golden_image(c["agent_seed"], 224) for c in cases]),
            "wrist": np.stack([golden_image(c["wrist_seed"], 224) for c in cases]),
            "state": np.array([c["state"] for c in cases], np.float32)}


def _folder_without(tmp_path, *names, extra=None):
    """A copy of the L1 fixture (symlinks) without `names`, plus `extra` {file name: bytes-writing callable}."""
    dst = tmp_path / "l1"
    dst.mkdir()
    for name in os.listdir(L1):
        if name not in names:
            os.symlink(os.path.realpath(os.path.join(L1, name)), dst / name)
    for name, write in (extra or {}).items():
        write(str(dst / name))
    return str(dst)


# ---------------------------------------------------------------- layout and detection
def test_the_head_file_makes_the_folder_the_l1_family_in_the_published_layout(policy):
    assert family_of_folder(L1) == "openvla_oft_l1" and family_of_folder(DISCRETE) == "openvla_oft"
    assert action_kind("openvla_oft_l1") == "regression"
    head = torch.load(os.path.join(L1, HEAD), weights_only=True)
    proj = torch.load(os.path.join(L1, PROPRIO), weights_only=True)
    assert all(k.startswith("module.") for k in list(head) + list(proj))  # saved from DDP, as published
    assert head["module.model.fc1.weight"].shape == (32, 7 * 32) and head["module.model.fc2.weight"].shape == (7, 32)
    assert head["module.model.mlp_resnet_blocks.1.ffn.1.weight"].shape == (32, 32)
    assert head["module.model.fc1.weight"].dtype == torch.bfloat16 and proj["module.fc1.weight"].dtype == torch.float32
    assert proj["module.fc1.weight"].shape == (32, 8)
    # nothing in the folder says how many images: 2 (the published L1 checkpoints); proprio from the projector file
    assert policy.cfg.num_images == 2 and policy.cfg.use_proprio is True and policy.cfg.type == "openvla_oft_l1"


def test_actions_equal_the_reference_implementation(policy, golden):
    """Three prompts of different lengths in one batch (padding), two images each and the proprio token: the head's
    normalised actions, the env actions (un-normalised, gripper binarised and flipped) and the normalised proprio."""
    obs, texts = _obs(golden), [c["instruction"] for c in golden]
    np.testing.assert_allclose(policy.normalize_proprio(obs["state"]), [c["proprio_normalized"] for c in golden],
                               atol=1e-6)
    normalized, _ = policy.predict(obs, texts)
    np.testing.assert_allclose(normalized.detach().numpy(), [c["normalized_actions"] for c in golden], atol=1e-4)
    actions, tokens, log_probs = policy.act(obs, texts)
    want = np.array([c["env_actions"] for c in golden])
    np.testing.assert_allclose(actions, want, atol=1e-4)
    assert set(np.unique(want[..., -1])) == {-1.0, 1.0}  # both gripper signs occur in the golden cases
    assert tokens.shape == (3, 0) and log_probs.shape == (3, 0)  # a regression head has neither


def test_normalisation_by_hand(policy):
    """Proprio: 2 (x - q01) / (q99 - q01) - 1 clipped (fixture q01/q99 for x: -0.25 / 0.15). Actions: the demo's
    -1 open / +1 close gripper -> 1 / 0 (not normalised, mask false); q01 -> -1, q99 -> 1, beyond q99 clipped."""
    state = np.zeros((2, 8), np.float32)
    state[0, 0], state[1, 0] = -0.05, 0.5  # midpoint -> 0; above q99 -> clipped to 1
    p = policy.normalize_proprio(state)
    assert abs(p[0, 0]) < 1e-6 and p[1, 0] == 1.0
    q01, q99 = policy.action_tokenizer.q01, policy.action_tokenizer.q99
    acts = np.stack([np.r_[q01[:6], -1.0], np.r_[q99[:6], 1.0], np.r_[q99[:6] + 1.0, 0.0]])
    x = policy.normalize_actions(acts).numpy()
    np.testing.assert_allclose(x[0, :6], -1.0, atol=1e-6)
    np.testing.assert_allclose(x[1, :6], 1.0, atol=1e-6)
    np.testing.assert_allclose(x[2, :6], 1.0)
    assert x[:, 6].tolist() == [1.0, 0.0, 1.0]
    env = policy.action_tokenizer.to_env(x)  # back: un-normalised, gripper 1 (open) -> -1, 0 (close) -> +1
    np.testing.assert_allclose(env[:2, :6], acts[:2, :6], atol=1e-6)
    assert env[:, 6].tolist() == [-1.0, 1.0, -1.0]


# ---------------------------------------------------------------- configuration and bad folders
def test_config_overrides_images_and_proprio(policy, golden, tmp_path):
    obs, texts = _obs(golden[:1]), [golden[0]["instruction"]]
    one = OpenVLAOFTL1Policy.load(L1, num_images=1, use_proprio=False).eval()
    a1, _, _ = one.act({"agentview": obs["agentview"]}, texts)  # neither wrist nor state needed
    a2, _, _ = policy.act(obs, texts)
    assert a1.shape == a2.shape == (1, 8, 7) and not np.allclose(a1, a2)
    with pytest.raises(ValueError, match="wrist"):
        policy.act({"agentview": obs["agentview"], "state": obs["state"]}, texts)
    with pytest.raises(PolicyLoadError, match="num_images=3"):
        OpenVLAOFTL1Policy.load(L1, num_images=3)
    no_proj = _folder_without(tmp_path, PROPRIO)
    assert OpenVLAOFTL1Policy.load(no_proj).cfg.use_proprio is False  # inferred from the folder
    with pytest.raises(PolicyLoadError, match="use_proprio=true but .* no proprio_projector"):
        OpenVLAOFTL1Policy.load(no_proj, use_proprio=True)


def test_bad_head_files_stop_in_one_line(tmp_path):
    from models.openvla_oft_l1 import L1ActionHead, save_component

    wrong = _folder_without(tmp_path, HEAD, extra={HEAD: lambda p: save_component(L1ActionHead(16), p)})
    with pytest.raises(PolicyLoadError, match="does not match an L1-regression head") as e:
        OpenVLAOFTL1Policy(OpenVLAOFTL1Config(init_path=wrong))
    assert "\n" not in str(e.value)
    with pytest.raises(PolicyLoadError, match="has no action_head--"):
        OpenVLAOFTL1Policy(OpenVLAOFTL1Config(init_path=DISCRETE))
    (tmp_path / "l1" / "noisy_action_projector--1_checkpoint.pt").write_bytes(b"")
    with pytest.raises(PolicyLoadError, match="diffusion-head"):
        OpenVLAOFTL1Policy(OpenVLAOFTL1Config(init_path=wrong))


# ---------------------------------------------------------------- SFT, save, reload, no RL
def test_l1_sft_loss_falls_and_the_saved_folder_reloads(golden, tmp_path):
    torch.manual_seed(0)
    pol = OpenVLAOFTL1Policy.load(L1, lora_rank=2).train()
    obs, texts = _obs(golden), [c["instruction"] for c in golden]
    rs = np.random.RandomState(0)
    demo = np.concatenate([rs.uniform(-0.5, 0.5, (3, 8, 6)), rs.choice([-1.0, 1.0], (3, 8, 1))], -1)
    params = [p for p in pol.parameters() if p.requires_grad]
    names = {n for n, p in pol.named_parameters() if p.requires_grad}
    assert any(n.startswith("action_head.") for n in names) and any("lora_" in n for n in names)
    opt = torch.optim.Adam(params, lr=3e-3)
    losses = []
    for _ in range(6):
        loss, info = pol.sft_loss(obs, texts, demo)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(info["sft/loss"])
    # the loss is openvla-oft's: mean |head - normalised demo actions|
    with torch.no_grad():
        pred, _ = pol.predict(obs, texts)
        by_hand = float((pred - pol.normalize_actions(demo)).abs().mean())
        assert abs(by_hand - pol.sft_loss(obs, texts, demo)[1]["sft/loss"]) < 1e-6
    assert losses[-1] < 0.7 * losses[0], losses
    pol.eval()
    want, _, _ = pol.act(obs, texts)
    pol.save(str(tmp_path / "saved"))
    files = set(os.listdir(tmp_path / "saved"))
    assert {HEAD, PROPRIO, "config.json", "model.safetensors.index.json", "dataset_statistics.json",
            "lora_adapter.safetensors", "policy_config.json"} <= files
    assert family_of_folder(str(tmp_path / "saved")) == "openvla_oft_l1"
    assert all(k.startswith("module.") for k in torch.load(tmp_path / "saved" / HEAD, weights_only=True))
    again = OpenVLAOFTL1Policy.load(str(tmp_path / "saved")).eval()
    assert again.cfg.lora_rank == 2 and again.cfg.num_images == 2
    got, _, _ = again.act(obs, texts)
    np.testing.assert_allclose(got, want, atol=1e-5)
    with pytest.raises(ValueError, match="no log-probs for RL"):
        again.log_prob(obs, texts, torch.zeros(3, 56, dtype=torch.long))


@pytest.mark.slow
def test_evaluate_and_sft_scripts_run_the_folder(tmp_path):
    """evaluate.py acts with the L1 head on tabletop (wrist camera + 8-d state); train_sft.py fine-tunes the folder
    with the L1 loss (falls) and exports a folder evaluate.py loads again as the same family."""
    out = run_script("evaluate.py", ["--checkpoint", L1, "--task-ids", "0", "--trials", "2", "--max-steps", "16",
                                     "--gifs", "0", "--out-dir", str(tmp_path / "eval")], None)
    results = json.load(open(tmp_path / "eval" / "results.json"))
    assert results["policy_type"] == "openvla_oft_l1", out.stdout[-500:]
    assert results["per_task"][0]["greedy_episodes"]["steps"] == [16, 16]  # the random model never succeeds
    export = tmp_path / "export"
    run_script("train_sft.py", ["--task-id", "0", "--no-wandb", f"policy.init_path={L1}", "sft.num_demos=2",
                                "sft.steps=8", "sft.eval_every=8", "sft.eval_trials=2", "sft.log_every=2",
                                "sft.lr=1e-3", "sft.warmup_steps=0", "env.num_envs=4", "log.run_name=sft",
                                f"sft.output_path={export}"], tmp_path)
    rows = [r for r in read_metrics(os.path.join(tmp_path, "runs", "sft")) if "sft/loss" in r]
    assert rows[-1]["sft/loss"] < 0.7 * rows[0]["sft/loss"], [r["sft/loss"] for r in rows]
    assert json.load(open(export / "policy_config.json"))["type"] == "openvla_oft_l1"
    assert HEAD in os.listdir(export) and PROPRIO in os.listdir(export)
    run_script("evaluate.py", ["--checkpoint", str(export), "--task-ids", "0", "--trials", "1", "--max-steps", "8",
                               "--gifs", "0", "--out-dir", str(tmp_path / "eval2")], None)
    assert json.load(open(tmp_path / "eval2" / "results.json"))["policy_type"] == "openvla_oft_l1"


@pytest.mark.parametrize("script,args", [
    ("train_srpo.py", [f"init.path={L1}", "policy.type=openvla_oft"]),
    ("train_gae_ppo.py", [f"init.path={L1}"]),
    ("train_luffy.py", [f"init.path={L1}"]),
    ("train_flowsar.py", [f"init.path={L1}"]),
    ("train_srpo.py", ["policy.type=openvla_oft_l1"]),
])
def test_every_rl_script_refuses_the_l1_family_in_one_line(tmp_path, script, args):
    out = run_script(script, ["--task-id", "0", "--no-wandb", *args], tmp_path, check=False)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr[-800:]
    assert len(out.stderr.strip().splitlines()) == 1 and out.stderr.startswith("error: ")
    assert "L1-regression checkpoint" in out.stderr and "no log-probs for RL" in out.stderr
    assert "Haozhan72/Openvla-oft-SFT-libero" in out.stderr and "Sylvest/OpenVLA-AC-PD-1traj-libero" in out.stderr
    assert not os.path.exists(tmp_path / "runs") or not os.listdir(tmp_path / "runs")


def test_no_rl_message_is_one_line():
    assert "\n" not in no_rl_message("x") and no_rl_message("x").startswith("x is an OpenVLA-OFT L1-regression")
