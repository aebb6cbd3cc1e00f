"""Model presets: where each component comes from, in which dtype, and how big it is.

`hunyuan` names the real repos (downloaded once into the Hugging Face cache, or read from --model-dir laid out like
the repos). `tiny` builds the same classes with tiny configs and seeded random weights in code: no download, runs
on a CPU in seconds, used by the tests and the quick start.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping


@dataclass(frozen=True)
class ComponentSource:
    repo: str
    subfolder: str | None
    dtype: str                     # "float16" | "bfloat16" | "float32"
    size_gb: float                 # on disk, for messages and the memory plan
    revision: str | None = None    # None = the repo's main branch


HUNYUAN_REPO = "hunyuanvideo-community/HunyuanVideo"
REDUX_REPO = "lllyasviel/flux_redux_bfl"


@dataclass(frozen=True)
class ModelPreset:
    name: str
    description: str
    text_encoder: ComponentSource
    tokenizer: ComponentSource
    text_encoder_2: ComponentSource
    tokenizer_2: ComponentSource
    vae: ComponentSource
    image_encoder: ComponentSource
    feature_extractor: ComponentSource
    transformer: ComponentSource          # original mode (inverted anti-drifting)
    transformer_f1: ComponentSource       # F1 (forward) mode
    default_resolution: int = 640
    tiny: bool = False
    # Only for tiny presets: model configs (kwargs of the real classes) and the seed of the random weights.
    tiny_configs: Mapping[str, Mapping] = field(default_factory=lambda: MappingProxyType({}))
    tiny_seed: int = 0

    def sources(self, mode: str) -> dict[str, ComponentSource]:
        """The components a job in `mode` needs, by role."""
        return {
            "text_encoder": self.text_encoder, "tokenizer": self.tokenizer,
            "text_encoder_2": self.text_encoder_2, "tokenizer_2": self.tokenizer_2,
            "vae": self.vae, "image_encoder": self.image_encoder, "feature_extractor": self.feature_extractor,
            "transformer": self.transformer_f1 if mode == "f1" else self.transformer,
        }

    def download_gb(self, mode: str) -> float:
        return round(sum(s.size_gb for s in self.sources(mode).values()), 1)


HUNYUAN = ModelPreset(
    name="hunyuan",
    description="HunyuanVideo + FramePack weights (about 42 GB, downloaded once)",
    text_encoder=ComponentSource(HUNYUAN_REPO, "text_encoder", "float16", 15.0),
    tokenizer=ComponentSource(HUNYUAN_REPO, "tokenizer", "float16", 0.01),
    text_encoder_2=ComponentSource(HUNYUAN_REPO, "text_encoder_2", "float16", 0.25),
    tokenizer_2=ComponentSource(HUNYUAN_REPO, "tokenizer_2", "float16", 0.01),
    vae=ComponentSource(HUNYUAN_REPO, "vae", "float16", 0.5),
    image_encoder=ComponentSource(REDUX_REPO, "image_encoder", "float16", 0.8),
    feature_extractor=ComponentSource(REDUX_REPO, "feature_extractor", "float16", 0.0),
    transformer=ComponentSource("lllyasviel/FramePackI2V_HY", None, "bfloat16", 25.7),
    transformer_f1=ComponentSource("lllyasviel/FramePack_F1_I2V_HY_20250503", None, "bfloat16", 25.7),
)

# Tiny configs that run the real classes (constraints in docs/FACTS.md, "Tiny configs").
_TINY_CONFIGS = {
    "llama": dict(vocab_size=263, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024),
    "clip": dict(vocab_size=514, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                 num_attention_heads=2, max_position_embeddings=77, projection_dim=16,
                 bos_token_id=512, eos_token_id=513, pad_token_id=513),
    "siglip": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                   image_size=32, patch_size=8),
    "vae": dict(in_channels=3, out_channels=3, latent_channels=16,
                down_block_types=("HunyuanVideoDownBlock3D",) * 4, up_block_types=("HunyuanVideoUpBlock3D",) * 4,
                block_out_channels=(8, 8, 8, 8), layers_per_block=1, norm_num_groups=4,
                spatial_compression_ratio=8, temporal_compression_ratio=4, mid_block_add_attention=True),
    "transformer": dict(in_channels=16, out_channels=16, num_attention_heads=2, attention_head_dim=16,
                        num_layers=1, num_single_layers=1, num_refiner_layers=1, patch_size=2, patch_size_t=1,
                        text_embed_dim=32, pooled_projection_dim=16, rope_axes_dim=(4, 6, 6),
                        image_condition_type=None, has_image_proj=True, image_proj_dim=32,
                        has_clean_x_embedder=True, guidance_embeds=True),
}


def _freeze(d: Mapping) -> Mapping:
    return MappingProxyType({k: _freeze(v) if isinstance(v, Mapping) else v for k, v in d.items()})


def _tiny(repo: str, size_gb: float = 0.0, dtype: str = "float32") -> ComponentSource:
    return ComponentSource(f"tiny/{repo}", None, dtype, size_gb)


TINY = ModelPreset(
    name="tiny",
    description="tiny random models built in code (no download; for trying the app and for tests)",
    text_encoder=_tiny("text_encoder"), tokenizer=_tiny("tokenizer"),
    text_encoder_2=_tiny("text_encoder_2"), tokenizer_2=_tiny("tokenizer_2"),
    vae=_tiny("vae"), image_encoder=_tiny("image_encoder"), feature_extractor=_tiny("feature_extractor"),
    transformer=_tiny("transformer"), transformer_f1=_tiny("transformer_f1"),
    default_resolution=64,
    tiny=True,
    tiny_configs=_freeze(_TINY_CONFIGS),
    tiny_seed=0,
)

PRESETS: Mapping[str, ModelPreset] = MappingProxyType({p.name: p for p in (HUNYUAN, TINY)})


def get_preset(name: str) -> ModelPreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"preset: unknown preset {name!r}; choose one of {', '.join(PRESETS)}") from None
