"""A tiny BERT saved to a temporary directory: stands in for all-MiniLM-L6-v2 in the tests
(same architecture and tokenizer kind, 2 layers of width 32: seconds instead of minutes)."""

from __future__ import annotations

import os
from pathlib import Path

WORDS = ("add two numbers return the sum of a list sort items by key read write file open close "
         "def return print value values string strings join split count first last max min "
         "query document negative text").split()


def write_tiny_bert(directory: Path, *, seed: int = 0) -> Path:
    """Save a randomly initialised 2-layer BERT (hidden 32) and its word-piece tokenizer."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    from transformers import BertConfig, BertModel, BertTokenizer

    directory.mkdir(parents=True, exist_ok=True)
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + list("0123456789(),.:=+_-")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *letters,
             *(f"##{c}" for c in letters), *WORDS]
    (directory / "vocab.txt").write_text("\n".join(dict.fromkeys(vocab)) + "\n")
    tokenizer = BertTokenizer(str(directory / "vocab.txt"), do_lower_case=True)
    tokenizer.save_pretrained(str(directory))
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(seed)
    BertModel(config).save_pretrained(str(directory))
    return directory
