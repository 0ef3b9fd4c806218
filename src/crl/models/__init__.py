"""Encoders: linear, MLP and small-CNN towers, projection heads, text towers (frozen MiniLM
features, a bag of tokens trained from scratch, or a pretrained transformer fine-tuned end to
end), the user's own towers (``model.kind: custom``) and the ``DualEncoder`` that pairs them;
embedding texts with a trained model and exporting it to sentence-transformers (docs/data.md).

Example:
    >>> import torch
    >>> from crl.data import DataInfo
    >>> info = DataInfo("vector", 2, 3, None, None, "toy")
    >>> model = build_model(ModelConfig(kind="linear", embed_dim=4), info)
    >>> za, zb = model(torch.randn(5, 2), torch.randn(5, 3))
    >>> za.shape, zb.shape, model.shared
    (torch.Size([5, 4]), torch.Size([5, 4]), False)
"""

from crl.models.build import build_model, resolve_kind
from crl.models.config import ModelConfig
from crl.models.dual import DualEncoder
from crl.models.encode import encode_texts
from crl.models.export import export_sentence_transformers
from crl.models.text import FrozenTextEncoder
from crl.models.towers import SmallCNN, Tower, mlp, projection_head
from crl.models.transformer import TransformerEncoder, TransformerTokenizer

__all__ = [
    "DualEncoder",
    "FrozenTextEncoder",
    "ModelConfig",
    "SmallCNN",
    "Tower",
    "TransformerEncoder",
    "TransformerTokenizer",
    "build_model",
    "encode_texts",
    "export_sentence_transformers",
    "mlp",
    "projection_head",
    "resolve_kind",
]
