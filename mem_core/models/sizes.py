"""The sizes a model may have: every training config and every export is checked against them, so a typo such as
``depth=100000`` is an error naming the key, not an allocation until the machine runs out of memory."""

from __future__ import annotations

from mem_core.errors import ConfigError
from mem_core.fields import AT_LEAST_0, FRACTION, Range, check_value, ranges_of
from mem_core.limits import (
    MAX_CHANNELS,
    MAX_DEPTH,
    MAX_INPUT_SIDE,
    MAX_MLP_RATIO,
    MAX_NUM_TOKENS,
    MAX_PARAMETERS,
    MAX_PATCHES,
    MAX_WIDTH,
)
from mem_core.models.tokenizer import MAX_LAYERS, TokenizerConfig
from mem_core.models.vit import ViTConfig

# The architectures' bounds, for dataclasses that live beside their models (generous for the paper's ViT-B/16; the
# limits are in mem_core/limits.py). The input's bounds are on ``InputSpec``'s fields.
SIDE, WIDTH = Range(1, MAX_INPUT_SIDE), Range(1, MAX_WIDTH)
VIT_RANGES = ranges_of(
    ViTConfig,
    img_size=SIDE,
    patch_size=SIDE,
    in_chans=Range(1, MAX_CHANNELS),
    embed_dim=WIDTH,
    depth=Range(1, MAX_DEPTH),
    num_heads=WIDTH,
    mlp_ratio=Range(0, MAX_MLP_RATIO, lo_open=True),
    drop_path=FRACTION,
    layer_scale_init=AT_LEAST_0,
)
TOKENIZER_RANGES = ranges_of(
    TokenizerConfig,
    in_chans=Range(1, MAX_CHANNELS),
    img_size=SIDE,
    num_tokens=Range(2, MAX_NUM_TOKENS),  # the diversity term divides by log(num_tokens)
    codebook_dim=WIDTH,
    num_layers=Range(1, MAX_LAYERS),
    hidden_dim=WIDTH,
    num_resnet_blocks=Range(0, MAX_DEPTH),
)


def check_model_sizes(model: ViTConfig | TokenizerConfig, prefix: str = "model.") -> None:
    """Raise a ``ConfigError`` naming the key unless every size of ``model`` lies in its range (``VIT_RANGES``,
    ``TOKENIZER_RANGES``), its grid has at most ``MAX_PATCHES`` cells and it holds at most ``MAX_PARAMETERS``."""
    vit = isinstance(model, ViTConfig)
    for name, bound in (VIT_RANGES if vit else TOKENIZER_RANGES).items():
        check_value(prefix + name, getattr(model, name), bound)
    rows, cols = model.grid_size
    if rows * cols > MAX_PATCHES:
        raise ConfigError(
            f"{prefix}img_size {model.img_size} in patches of {model.patch_size} px gives {rows * cols} tokens, "
            f"at most {MAX_PATCHES}"
        )
    parameters = _vit_parameters(model) if vit else _tokenizer_parameters(model)
    if parameters > MAX_PARAMETERS:
        raise ConfigError(
            f"{prefix.rstrip('.')}: these sizes make about {parameters:.3g} parameters, at most {MAX_PARAMETERS:.3g}"
        )


def _vit_parameters(c: ViTConfig) -> float:
    """The weights of the transformer blocks: attention (4 d^2) and MLP (2 r d^2) per block."""
    return c.depth * (4 + 2 * c.mlp_ratio) * c.embed_dim**2


def _tokenizer_parameters(c: TokenizerConfig) -> float:
    """The weights of the dVAE: 4 x 4 (de)convolutions, residual blocks of 19 h^2, the codebook and its logits."""
    return (32 * c.num_layers + 38 * c.num_resnet_blocks) * c.hidden_dim**2 + c.num_tokens * (
        c.hidden_dim + c.codebook_dim
    )
