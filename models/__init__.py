"""Policies, value head and trajectory encoders (see each module's docstring)."""
from models.action_tokenizer import ACTION_DIM, ActionTokenizer
from models.flow_policy import FlowPolicy, FlowPolicyConfig, FlowSample, Prefix
from models.text_tokenizer import ByteTokenizer, HFTextTokenizer, load_text_tokenizer
from models.token_policy import TokenPolicy, TokenPolicyConfig, count_parameters
from models.trajectory_encoders import EncoderConfig, PixelEncoder, VJEPA2Encoder, make_trajectory_encoder
from models.value_head import ValueHead, ValueHeadConfig

__all__ = ["ACTION_DIM", "ActionTokenizer", "FlowPolicy", "FlowPolicyConfig", "FlowSample", "Prefix", "ByteTokenizer",
           "HFTextTokenizer", "load_text_tokenizer", "TokenPolicy",
           "TokenPolicyConfig", "count_parameters", "EncoderConfig", "PixelEncoder", "VJEPA2Encoder",
           "make_trajectory_encoder", "ValueHead", "ValueHeadConfig"]
