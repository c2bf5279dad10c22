"""Policies, value head and trajectory encoders (see each module's docstring). The names below load their module on
first use, so a script that trains a token policy never imports the flow policy's transformers models (PEP 562)."""
import importlib

_HOME = {
    "models.action_tokenizer": ["ACTION_DIM", "ActionTokenizer"],
    "models.configs": ["EncoderConfig", "FlowPolicyConfig", "OpenVLAOFTConfig", "TokenPolicyConfig", "ValueHeadConfig"],
    "models.flow_policy": ["FlowPolicy", "FlowSample", "Prefix"],
    "models.text_tokenizer": ["ByteTokenizer", "HFTextTokenizer", "load_text_tokenizer"],
    "models.token_policy": ["TokenPolicy", "count_parameters"],
    "models.trajectory_encoders": ["PixelEncoder", "VJEPA2Encoder", "make_trajectory_encoder"],
    "models.value_head": ["ValueHead"],
}
_MODULE_OF = {name: module for module, names in _HOME.items() for name in names}
__all__ = list(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'models' has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULE_OF[name]), name)
