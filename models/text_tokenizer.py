"""Instruction tokenizers behind one call: `tok(list_of_str) -> (input_ids, attention_mask)`, right-padded tensors.

`ByteTokenizer` (no download) for randomly initialised backbones; `HFTextTokenizer` wraps `AutoTokenizer` for a real
LM checkpoint. `load_text_tokenizer(path)` picks one.
"""
from __future__ import annotations

import os
from typing import List, Optional, Sequence, Tuple

import torch
from transformers import AutoTokenizer


class ByteTokenizer:
    """UTF-8 bytes -> ids 0..255, plus pad=256, bos=257, eos=258; BOS is prepended, long strings are truncated."""

    vocab_size = 259
    pad_token_id = 256
    bos_token_id = 257
    eos_token_id = 258

    def __init__(self, max_length: int = 48):
        if max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        self.max_length = max_length

    def __call__(self, texts: Sequence[str]) -> Tuple[torch.Tensor, torch.Tensor]:
        rows = [[self.bos_token_id] + list(t.encode("utf-8"))[: self.max_length - 1] for t in _check_texts(texts)]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
            mask[i, : len(r)] = 1
        return ids, mask

    def save_pretrained(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "byte_tokenizer.txt"), "w") as f:
            f.write(str(self.max_length))


class HFTextTokenizer:
    """A `transformers` tokenizer (`AutoTokenizer.from_pretrained`) with right padding and truncation."""

    def __init__(self, path: str, max_length: int = 48):
        self.tok = AutoTokenizer.from_pretrained(path)
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        self.tok.padding_side = "right"
        self.max_length = max_length
        self.vocab_size = len(self.tok)

    def __call__(self, texts: Sequence[str]) -> Tuple[torch.Tensor, torch.Tensor]:
        enc = self.tok(list(_check_texts(texts)), padding=True, truncation=True, max_length=self.max_length,
                       return_tensors="pt")
        return enc["input_ids"], enc["attention_mask"]

    def save_pretrained(self, path: str) -> None:
        self.tok.save_pretrained(path)


def load_text_tokenizer(path: Optional[str], max_length: int = 48):
    """`AutoTokenizer` from `path` (hub id or dir); None or a saved ByteTokenizer dir -> ByteTokenizer."""
    if path is None:
        return ByteTokenizer(max_length)
    if os.path.isfile(os.path.join(path, "byte_tokenizer.txt")):
        return ByteTokenizer(max_length)
    return HFTextTokenizer(path, max_length)


def _check_texts(texts: Sequence[str]) -> List[str]:
    if isinstance(texts, str):
        raise ValueError("instructions must be a list of strings (one per batch row), got a single str")
    texts = list(texts)
    if len(texts) == 0:
        raise ValueError("instructions is empty: need one string per batch row")
    bad = [type(t).__name__ for t in texts if not isinstance(t, str)]
    if bad:
        raise ValueError(f"instructions must all be str, got element types {sorted(set(bad))}")
    return texts
