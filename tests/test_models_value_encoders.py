"""Value head (the GAE-PPO reference's sizes) and trajectory encoders (V-JEPA 2 tiny / from_pretrained, pixels)."""
import numpy as np
import pytest
import torch

from models.trajectory_encoders import (IMAGENET_MEAN, IMAGENET_STD, EncoderConfig, PixelEncoder, VJEPA2Encoder,
                                        make_trajectory_encoder, sample_frame_indices)
from models.value_head import ValueHead, ValueHeadConfig


def test_value_head_sizes_output_and_errors():
    head = ValueHead(128)
    linears = [m for m in head.net if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(128, 1024), (1024, 512), (512, 1)]
    v = head(torch.randn(5, 128))
    assert v.shape == (5,) and v.abs().max() < 0.5  # small last layer, zero bias: values start near 0
    small = ValueHead(16, ValueHeadConfig(hidden_dims=[8]))
    assert [m.out_features for m in small.net if isinstance(m, torch.nn.Linear)] == [8, 1]
    with pytest.raises(ValueError, match=r"shape \(5, 64\); expected \(B, 128\) or \(B, S, 128\)"):
        head(torch.randn(5, 64))
    # it regresses: a few Adam steps fit a linear target
    torch.manual_seed(0)
    x = torch.randn(64, 16)
    y = x[:, 0] * 2.0
    small = ValueHead(16, ValueHeadConfig(hidden_dims=[32]))
    opt = torch.optim.Adam(small.parameters(), lr=1e-2)
    for _ in range(300):
        loss = ((small(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05


def test_value_head_activation_init_and_step_mean():
    """relu (both references' critics) against a hand-built ReLU MLP with the same weights; init rlinf (RLinf's
    ValueHead._init_weights): zero biases, hidden weights kaiming-normal over fan_out (std sqrt(2 / fan_out)), the
    last N(0, 0.02^2); torch: torch's default (the last bias not zero); small_last, the default, draws as before (the
    same weights from the same seed). A (B, S, D) input gives the mean of the S values."""
    torch.manual_seed(0)
    relu = ValueHead(16, ValueHeadConfig(hidden_dims=[8], activation="relu"))
    l1, l2 = [m for m in relu.net if isinstance(m, torch.nn.Linear)]
    x = torch.randn(4, 16)
    np.testing.assert_allclose(relu(x).detach().numpy(), l2(torch.relu(l1(x))).squeeze(-1).detach().numpy(),
                               rtol=1e-6)
    torch.manual_seed(0)
    rl = ValueHead(2048, ValueHeadConfig(hidden_dims=[1024, 512], activation="relu", init="rlinf"))
    w = [m for m in rl.net if isinstance(m, torch.nn.Linear)]
    assert all(float(m.bias.abs().max()) == 0.0 for m in w)
    assert abs(float(w[0].weight.std()) - (2 / 1024) ** 0.5) < 0.002  # fan_out = 1024
    assert abs(float(w[1].weight.std()) - (2 / 512) ** 0.5) < 0.003
    assert abs(float(w[2].weight.std()) - 0.02) < 0.003
    torch.manual_seed(0)
    assert float(ValueHead(64, ValueHeadConfig(hidden_dims=[32], init="torch")).net[-1].bias.abs().max()) > 0
    torch.manual_seed(0)
    a = ValueHead(16, ValueHeadConfig(hidden_dims=[8]))
    torch.manual_seed(0)
    l1, l2 = torch.nn.Linear(16, 8), torch.nn.Linear(8, 1)  # the default's draws, by hand
    torch.nn.init.normal_(l2.weight, std=0.01)
    assert torch.equal(a.net[0].weight, l1.weight) and torch.equal(a.net[-1].weight, l2.weight)
    h = torch.randn(3, 5, 16)
    np.testing.assert_allclose(a(h).detach().numpy(), torch.stack([a(h[:, s]) for s in range(5)], 1).mean(1)
                               .detach().numpy(), rtol=1e-6)
    for bad in (dict(activation="tanh"), dict(init="xavier")):
        with pytest.raises(ValueError, match="value_head"):
            ValueHead(16, ValueHeadConfig(**bad))


def test_frame_indices_hand_values():
    assert sample_frame_indices(5, 3).tolist() == [0, 2, 4]
    assert sample_frame_indices(2, 4).tolist() == [0, 0, 1, 1]
    assert sample_frame_indices(100, 2).tolist() == [0, 99]


def videos():
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (t, 48, 48, 3), dtype=np.uint8) for t in (3, 17, 40)] + [
        np.zeros((0, 48, 48, 3), np.uint8), np.zeros((9, 48, 48, 3), np.uint8)]


def test_vjepa2_tiny_shape_determinism_and_invalid_rows():
    enc = make_trajectory_encoder(EncoderConfig(), device="cpu")
    assert isinstance(enc, VJEPA2Encoder) and enc.dim == 64
    z = enc.embed(videos())
    assert z.shape == (5, 64) and z.dtype == np.float32
    assert np.all(z[3:] == 0.0) and np.all(np.abs(z[:3]).sum(1) > 0)  # empty and all-black -> zeros
    assert np.abs(z[0] - z[1]).max() > 1e-4  # different episodes -> different embeddings
    again = make_trajectory_encoder(EncoderConfig(), device="cpu").embed(videos())
    np.testing.assert_array_equal(z, again)  # same seed, same input -> same embedding
    np.testing.assert_allclose(enc.embed(videos()[1:2])[0], z[1], atol=1e-5)  # independent of the batch
    with pytest.raises(ValueError, match=r"videos\[0\] has shape \(4, 48, 48\)"):
        enc.embed([np.zeros((4, 48, 48), np.uint8)])
    with pytest.raises(ValueError, match="multiple of the tubelet size"):
        VJEPA2Encoder(EncoderConfig(num_frames=5))


def test_vjepa2_preprocessing_matches_the_video_processor_recipe():
    enc = VJEPA2Encoder(EncoderConfig(crop_size=32, num_frames=4), device="cpu")
    video = np.full((6, 40, 60, 3), 128, np.uint8)
    x = enc.preprocess(video)
    assert x.shape == (4, 3, 32, 32)  # shortest edge -> int(32 * 256 / 224) = 36, centre crop 32
    want = (128 / 255 - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)
    np.testing.assert_allclose(x[:, :, 10, 10].numpy(), np.tile(want, (4, 1)), atol=1e-5)


def test_vjepa2_through_from_pretrained(tmp_path):
    from transformers import VJEPA2Config, VJEPA2Model

    torch.manual_seed(1)
    model = VJEPA2Model(VJEPA2Config(crop_size=32, frames_per_clip=4, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, pred_hidden_size=16, pred_num_hidden_layers=1,
                                     pred_num_attention_heads=2, num_pooler_layers=1)).eval()
    model.save_pretrained(tmp_path)
    enc = make_trajectory_encoder(EncoderConfig(model_path=str(tmp_path), num_frames=4), device="cpu")
    assert enc.crop_size == 32 and enc.dim == 32
    vid = videos()[1]
    with torch.no_grad():
        want = model(pixel_values_videos=enc.preprocess(vid)[None], skip_predictor=True).last_hidden_state.mean(1)
    np.testing.assert_allclose(enc.embed([vid])[0], want[0].numpy(), atol=1e-5)


def test_pixel_baseline_hand_values():
    enc = make_trajectory_encoder(EncoderConfig(kind="pixels", num_frames=2, pixel_size=2))
    assert isinstance(enc, PixelEncoder) and enc.dim == 24
    v = np.zeros((3, 4, 4, 3), np.uint8)
    v[0, :2, :2] = 255  # frame 0: top-left quadrant white; frame 2: all 51
    v[2] = 51
    z = enc.embed([v, np.zeros((0, 4, 4, 3), np.uint8)])
    # frames 0 and 2 are sampled; layout (frame, channel, y, x)
    want = np.concatenate([np.tile([1.0, 0, 0, 0], 3), np.full(12, 0.2)]).astype(np.float32)
    np.testing.assert_allclose(z[0], want, atol=1e-6)
    assert np.all(z[1] == 0)
    with pytest.raises(ValueError, match="kind must be"):
        make_trajectory_encoder(EncoderConfig(kind="clip"))


def test_final_spatial_pooling_shapes_and_final_frames_only():
    vjepa = make_trajectory_encoder(EncoderConfig(pooling="final_spatial"), device="cpu")
    assert vjepa.dim == (64 // 16) ** 2 * 64  # 16 patches of the last tubelet x hidden size 64
    pixels = make_trajectory_encoder(EncoderConfig(kind="pixels", pixel_size=4, pooling="final_spatial"))
    assert pixels.dim == 4 * 4 * 3  # the last frame only
    vids = videos()
    edited = [v.copy() for v in vids]
    edited[2][:30] = 0  # frames 0..29 of the 40-frame episode (the last tubelet is sampled frames 36 and 39)
    last = [v.copy() for v in vids]
    last[2][-1] = 255 - last[2][-1]
    for enc in (vjepa, pixels):
        z = enc.embed(vids)
        assert z.shape == (5, enc.dim) and z.dtype == np.float32
        assert np.all(z[3:] == 0.0) and np.all(np.abs(z[:3]).sum(1) > 0)  # empty and all-black -> zeros
        np.testing.assert_array_equal(enc.embed(edited), z)  # early frames do not matter
        changed = enc.embed(last)
        assert np.abs(changed[2] - z[2]).max() > 1e-3  # the last frame does
        np.testing.assert_array_equal(changed[:2], z[:2])
    # pixels: hand values of the last frame, layout (channel, y, x)
    enc = make_trajectory_encoder(EncoderConfig(kind="pixels", num_frames=2, pixel_size=2, pooling="final_spatial"))
    v = np.zeros((3, 4, 4, 3), np.uint8)
    v[0] = 255
    v[2, :2, :2] = 255
    np.testing.assert_allclose(enc.embed([v])[0], np.tile([1.0, 0, 0, 0], 3), atol=1e-6)
    # vjepa2: the last tubelet's tokens, not averaged: their mean over patches is the model's mean over that tubelet
    x = vjepa.preprocess(vids[1])
    assert x.shape == (2, 3, 64, 64)
    with torch.no_grad():
        h = vjepa.model(pixel_values_videos=x[None], skip_predictor=True).last_hidden_state[0]
    np.testing.assert_allclose(vjepa.embed(vids[1:2])[0], h.flatten().numpy(), atol=1e-5)
    np.testing.assert_allclose(vjepa.embed(vids[1:2])[0].reshape(16, 64).mean(0), h.mean(0).numpy(), atol=1e-5)


def test_mean_pooling_is_the_default_and_bad_pooling_errors():
    assert EncoderConfig().pooling == "mean"
    vids = videos()
    np.testing.assert_array_equal(make_trajectory_encoder(EncoderConfig(pooling="mean"), device="cpu").embed(vids),
                                  make_trajectory_encoder(EncoderConfig(), device="cpu").embed(vids))
    for kind in ("vjepa2", "pixels"):
        with pytest.raises(ValueError, match=r"pooling must be one of mean, final_spatial; got 'max'"):
            make_trajectory_encoder(EncoderConfig(kind=kind, pooling="max"), device="cpu")
