"""Transformer blocks and models built from our layer, and the model table's presets."""

from . import examples
from .blocks import DecoderBlock, EncoderBlock, FeedForward, sinusoidal_positions
from .convert import encoder_from_bert
from .presets import PRESETS, Preset, attention_flops_per_token, build, count_parameters, presets_table
from .transformer import DecoderLM, Encoder, EncoderDecoder, ModelConfig

__all__ = ["PRESETS", "DecoderBlock", "DecoderLM", "Encoder", "EncoderBlock", "EncoderDecoder", "FeedForward",
           "ModelConfig", "Preset", "attention_flops_per_token", "build", "count_parameters", "encoder_from_bert",
           "examples", "presets_table", "sinusoidal_positions"]
