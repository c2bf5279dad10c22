"""ActionTokenizer (bins, percentile stats, gripper, persistence) and the instruction tokenizers."""
import numpy as np
import pytest

from models.action_tokenizer import ActionTokenizer
from models.text_tokenizer import ByteTokenizer, HFTextTokenizer, load_text_tokenizer


def test_identity_stats_hand_values():
    tok = ActionTokenizer()  # [-1, 1], 256 bins of width 2/256
    a = np.array([[-1.0, -0.99, 0.0, 0.004, 0.5, 1.0, -1.0]])
    # bin = floor((a + 1) / 2 * 256), clipped to 255
    assert tok.encode(a).tolist() == [[0, 1, 128, 128, 192, 255, 0]]
    dec = tok.decode(np.array([[0, 1, 128, 128, 192, 255, 100]]))
    np.testing.assert_allclose(dec[0, :6], [-1 + 1 / 256, -1 + 3 / 256, 1 / 256, 1 / 256, 0.5 + 1 / 256, 1 - 1 / 256],
                               atol=1e-6)
    assert dec[0, 6] == -1.0 and dec.dtype == np.float32  # gripper binarised: bin 100 < 128 -> open


def test_round_trip_error_at_most_half_a_bin():
    rng = np.random.default_rng(0)
    demo = rng.normal(0, 0.3, size=(5000, 7)).clip(-1, 1)
    demo[:, 6] = rng.choice([-1.0, 1.0], size=5000)
    tok = ActionTokenizer.fit(demo)
    inside = (demo >= tok.low) & (demo <= tok.high)
    err = np.abs(tok.decode(tok.encode(demo)) - demo)
    half_bin = (tok.high - tok.low) / 256 / 2
    assert np.all((err <= half_bin + 1e-6)[:, :6] | ~inside[:, :6]) and inside[:, :6].mean() > 0.97
    assert np.all(err[:, 6] == 0.0)  # gripper is exactly +-1 after the round trip
    # values outside [q01, q99] are clipped to the nearest edge bin
    assert tok.encode(np.full((1, 7), 5.0)).tolist() == [[255] * 7]


def test_fit_uses_1st_and_99th_percentiles_and_keeps_gripper_identity():
    demo = np.tile(np.linspace(-0.5, 0.5, 101)[:, None], (1, 7))  # 1st pct = -0.49, 99th = 0.49
    demo[:, 3] = 0.2  # a constant dim gets a +-1e-3 window
    tok = ActionTokenizer.fit(demo)
    np.testing.assert_allclose(tok.low[:3], -0.49)
    np.testing.assert_allclose(tok.high[:3], 0.49)
    np.testing.assert_allclose([tok.low[3], tok.high[3]], [0.199, 0.201])
    assert (tok.low[6], tok.high[6]) == (-1.0, 1.0)
    np.testing.assert_allclose(tok.normalize(np.array([0.49] * 6 + [1.0])).numpy()[:3], 1.0)


def test_save_load_and_bad_inputs(tmp_path):
    tok = ActionTokenizer(low=[-0.5] * 7, high=[0.5] * 7, n_bins=64, binarize_gripper=False)
    tok.save(str(tmp_path))
    back = ActionTokenizer.load(str(tmp_path))
    assert back.state_dict() == tok.state_dict()
    with pytest.raises(ValueError, match=r"\(\.\.\., 7\)"):
        tok.encode(np.zeros((2, 6)))
    with pytest.raises(ValueError, match=r"\[0, 64\)"):
        tok.decode(np.full((1, 7), 64))
    with pytest.raises(ValueError, match="high > low"):
        ActionTokenizer(low=[0.0] * 7, high=[0.0] * 7)


def test_byte_tokenizer_pads_right_with_bos():
    ids, mask = ByteTokenizer(max_length=4)(["ab", "abcdef"])
    assert ids.tolist() == [[257, 97, 98, 256], [257, 97, 98, 99]]  # BOS, bytes, pad; truncated to 4
    assert mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    with pytest.raises(ValueError, match="empty"):
        ByteTokenizer()([])
    with pytest.raises(ValueError, match="single str"):
        ByteTokenizer()("put the bowl")


def save_tiny_hf_tokenizer(path: str) -> None:
    """A word-level `transformers` tokenizer built offline, saved so AutoTokenizer.from_pretrained can load it."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<unk>", "</s>", "put", "the", "red", "block", "on", "blue", "plate"]
    wl = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    wl.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=wl, pad_token="<pad>", unk_token="<unk>", eos_token="</s>")
    fast.save_pretrained(path)


def test_hf_tokenizer_through_autotokenizer(tmp_path):
    save_tiny_hf_tokenizer(str(tmp_path))
    tok = load_text_tokenizer(str(tmp_path), max_length=8)
    assert isinstance(tok, HFTextTokenizer) and tok.vocab_size == 10
    ids, mask = tok(["put the red block", "put the block on the blue plate"])
    assert ids.tolist() == [[3, 4, 5, 6, 0, 0, 0], [3, 4, 6, 7, 4, 8, 9]]
    assert mask.sum(1).tolist() == [4, 7]
