"""What a model's sizes give together: its token grid and its parameter count, held to ``MAX_PATCHES`` and
``MAX_PARAMETERS`` by every training config and every export. Each size's own bounds are on its field (``ViTConfig``,
``TokenizerConfig``), so a typo such as ``depth=100000`` is refused, naming the key, as the config is built."""

from __future__ import annotations

from mem_core.fields import ConfigConflict
from mem_core.limits import MAX_PARAMETERS, MAX_PATCHES
from mem_core.models.tokenizer import TokenizerConfig
from mem_core.models.vit import ViTConfig


def check_model_sizes(model: ViTConfig | TokenizerConfig, prefix: str = "model.") -> None:
    """Raise a ``ConfigConflict`` (fields that only fit together) naming the key unless the grid of ``model`` has at most ``MAX_PATCHES`` cells and it
    holds at most ``MAX_PARAMETERS``."""
    rows, cols = model.grid_size
    if rows * cols > MAX_PATCHES:
        raise ConfigConflict(
            f"{prefix}img_size {model.img_size} in patches of {model.patch_size} px gives {rows * cols} tokens, "
            f"at most {MAX_PATCHES}"
        )
    parameters = _vit_parameters(model) if isinstance(model, ViTConfig) else _tokenizer_parameters(model)
    if parameters > MAX_PARAMETERS:
        raise ConfigConflict(
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
