"""Tiny random CLIP / SigLIP / SigLIP2 directories, built from transformers' config classes (no downloads).

`make_image_text_dir(tmp_path, kind)` writes config.json, model.safetensors, tokenizer.json (+ its config) and
preprocessor_config.json as `save_pretrained` lays them out. Towers: hidden 32, 2 layers, 4 heads, 28x28 images
in 7x7 patches; weights drawn with a fixed seed at std 0.2 so outputs differ per input. The tokenizer is a small
WordPiece one ([SEP] is CLIP's end-of-text token, id 3). Heavy imports happen inside the function.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.tiny_models import _bert_tokenizer

KINDS = ("clip", "siglip", "siglip2")
IMAGE, PATCH, TEXT_POSITIONS = 28, 7, 16
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PREPROCESSORS: dict[str, dict[str, Any]] = {
    "clip": {
        "image_processor_type": "CLIPImageProcessor",
        "size": {"shortest_edge": IMAGE},
        "crop_size": {"height": IMAGE, "width": IMAGE},
        "do_center_crop": True,
        "resample": 3,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
    },
    "siglip": {
        "image_processor_type": "SiglipImageProcessor",
        "size": {"height": IMAGE, "width": IMAGE},
        "resample": 2,
    },
    "siglip2": {"image_processor_type": "Siglip2ImageProcessor", "patch_size": PATCH, "max_num_patches": 16},
}


def make_image_text_dir(tmp_path: Path, kind: str, seed: int = 0) -> Path:
    import torch
    import transformers

    out = tmp_path / f"tiny-{kind}"
    tok, vocab = _bert_tokenizer(SPECIALS, "[CLS]", "[SEP]", False)
    towers = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    text = {**towers, "vocab_size": len(vocab), "max_position_embeddings": TEXT_POSITIONS}
    vision = {**towers, "image_size": IMAGE, "patch_size": PATCH}
    if kind == "clip":
        text.update(eos_token_id=vocab["[SEP]"], bos_token_id=vocab["[CLS]"], pad_token_id=0)
        config: Any = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
        model: Any = transformers.CLIPModel(config)
    elif kind == "siglip":
        text.update(pad_token_id=0)
        config = transformers.SiglipConfig(text_config=text, vision_config=vision)
        model = transformers.SiglipModel(config)
    else:
        # Siglip2Tokenizer adds <bos>, <eos> and <mask> after the file's vocabulary (ids 130-132 here): the
        # embedding table covers them, as a real SigLIP2's does (the int8 calibration texts include them)
        text.update(vocab_size=len(vocab) + 3)
        vision.pop("image_size")
        config = transformers.Siglip2Config(text_config=text, vision_config={**vision, "num_patches": 16})
        model = transformers.Siglip2Model(config)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    model.save_pretrained(out)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]"
    )
    fast.model_max_length = TEXT_POSITIONS
    fast.save_pretrained(out)
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSORS[kind]))
    return out
