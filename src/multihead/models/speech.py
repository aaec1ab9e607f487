"""Attention over speech: a keyword spotter built from our encoder, on words spoken offline.

No recorded speech ships in a wheel, so the words are synthesised with ``espeak-ng`` (a Debian
package: ``apt-get install espeak-ng``) in several voices and speeds; each recording becomes
log-mel frames (``torch.stft`` and a triangular mel filterbank, no torchaudio), the frames are the
tokens of an encoder with a [CLS] token, and the classifier reads [CLS]. Training uses some voices,
the test a voice the model never heard. :func:`speech_report` then analyses every head over the
frames like any other model's (entropy, distance in frames, local, [CLS] mass, labels).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..masks import key_padding
from .blocks import EncoderBlock, sinusoidal_positions

__all__ = ["KEYWORDS", "TEST_VOICE", "TRAIN_VOICES", "KeywordSpotter", "SpokenWords", "frames_batch", "log_mel",
           "spoken_keywords", "synthesize", "train_keyword_spotter"]

KEYWORDS = ("yes", "no", "up", "down", "left", "right", "stop", "go", "on", "off")
TRAIN_VOICES = ("en", "en+m3", "en+f3", "en+m7", "en-us+f2", "en-us")
TEST_VOICE = "en+f4"  # never heard in training
SPEEDS = (110, 140, 175, 210)  # words per minute
PITCHES = (35, 50, 65)
N_MELS = 40
HOP = 0.010  # seconds between frames
WINDOW = 0.025  # seconds per frame


def synthesize(word: str, voice: str, speed: int, pitch: int = 50, folder: Path | None = None
               ) -> tuple[np.ndarray, int]:
    """``word`` spoken by espeak-ng: (float waveform in [-1, 1], sample rate)."""
    program = shutil.which("espeak-ng")
    if program is None:
        raise FileNotFoundError("speech needs espeak-ng to synthesise words offline: apt-get install espeak-ng")
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        path = Path(tmp) / "word.wav"
        subprocess.run([program, "-v", voice, "-s", str(speed), "-p", str(pitch), "-w", str(path), word],
                       check=True, capture_output=True, timeout=60)
        with wave.open(str(path), "rb") as w:
            rate, frames = w.getframerate(), w.readframes(w.getnframes())
    return np.frombuffer(frames, dtype="<i2").astype(np.float32) / 32768.0, rate


def _mel_filterbank(n_fft: int, rate: int, n_mels: int) -> Tensor:
    """(n_mels, n_fft // 2 + 1) triangular filters equally spaced on the mel scale (HTK formula)."""
    def mel(f):
        return 2595.0 * np.log10(1.0 + f / 700.0)

    def hz(m):
        return 700.0 * (10 ** (m / 2595.0) - 1.0)

    edges = hz(np.linspace(mel(20.0), mel(rate / 2), n_mels + 2))  # (n_mels + 2,) Hz
    bins = np.linspace(0, rate / 2, n_fft // 2 + 1)
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rise = (bins[None] - lower) / (centre - lower)
    fall = (upper - bins[None]) / (upper - centre)
    return torch.tensor(np.clip(np.minimum(rise, fall), 0.0, None), dtype=torch.float32)


def log_mel(waveform: np.ndarray, rate: int, n_mels: int = N_MELS) -> Tensor:
    """(frames, n_mels) log-mel energies: 25 ms Hann windows every 10 ms, silence trimmed at both ends."""
    x = torch.tensor(waveform, dtype=torch.float32)
    win, hop = int(WINDOW * rate), int(HOP * rate)
    n_fft = 1 << (win - 1).bit_length()
    spec = torch.stft(x, n_fft, hop_length=hop, win_length=win, window=torch.hann_window(win),
                      center=True, return_complex=True).abs().pow(2)  # (freq, frames)
    energy = _mel_filterbank(n_fft, rate, n_mels) @ spec  # (n_mels, frames)
    features = (energy + 1e-6).log().T  # (frames, n_mels)
    loud = features.mean(-1) > features.mean(-1).max() - 6.0  # frames within ~26 dB of the loudest
    idx = loud.nonzero().squeeze(1)
    return features[int(idx.min()):int(idx.max()) + 1] if len(idx) else features


@dataclass
class SpokenWords:
    features: list[Tensor]  # each (frames, n_mels)
    labels: Tensor  # (N,) index into KEYWORDS
    voices: list[str]


def spoken_keywords(voices: tuple[str, ...] = (*TRAIN_VOICES, TEST_VOICE), *, speeds: tuple[int, ...] = SPEEDS,
                    pitches: tuple[int, ...] = PITCHES) -> SpokenWords:
    """Every keyword in every voice, speed and pitch, as log-mel features."""
    features, labels, who = [], [], []
    for voice in voices:
        for k, word in enumerate(KEYWORDS):
            for speed in speeds:
                for pitch in pitches:
                    features.append(log_mel(*synthesize(word, voice, speed, pitch)))
                    labels.append(k)
                    who.append(voice)
    return SpokenWords(features, torch.tensor(labels), who)


class KeywordSpotter(nn.Module):
    """Log-mel frames → linear embedding + sinusoidal positions, [CLS], encoder blocks, head on [CLS]."""

    def __init__(self, n_mels: int = N_MELS, dim: int = 64, heads: int = 4, layers: int = 2,
                 classes: int = len(KEYWORDS)) -> None:
        super().__init__()
        self.embed = nn.Linear(n_mels, dim)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.blocks = nn.ModuleList([EncoderBlock(dim, heads, 2 * dim, dropout=0.0, norm_first=True)
                                     for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, frames: Tensor, valid: Tensor) -> Tensor:
        """frames (B, T, n_mels) padded, valid (B, T) bool → logits (B, classes)."""
        B, T, _ = frames.shape
        x = self.embed(frames) + sinusoidal_positions(T, self.embed.out_features).to(frames)  # (B, T, D)
        x = torch.cat([self.cls.expand(B, -1, -1), x], 1)  # (B, 1 + T, D)
        mask = key_padding(torch.cat([torch.ones(B, 1, dtype=torch.bool), valid], 1))  # [CLS] is always real
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x[:, 0]))


def frames_batch(features: list[Tensor], mean: Tensor, std: Tensor) -> tuple[Tensor, Tensor]:
    T = max(len(f) for f in features)
    frames = torch.zeros(len(features), T, features[0].shape[1])
    valid = torch.zeros(len(features), T, dtype=torch.bool)
    for b, f in enumerate(features):
        frames[b, :len(f)] = (f - mean) / std
        valid[b, :len(f)] = True
    return frames, valid


def train_keyword_spotter(*, epochs: int = 40, seed: int = 0, data: SpokenWords | None = None) -> dict:
    """Train on the training voices, test on :data:`TEST_VOICE`; returns accuracies, the model and data."""
    data = data or spoken_keywords()
    train = [i for i, v in enumerate(data.voices) if v != TEST_VOICE]
    test = [i for i, v in enumerate(data.voices) if v == TEST_VOICE]
    stacked = torch.cat([data.features[i] for i in train])
    mean, std = stacked.mean(0), stacked.std(0).clamp_min(1e-3)
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    model = KeywordSpotter()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    for _ in range(epochs):
        model.train()
        order = [train[int(i)] for i in torch.randperm(len(train), generator=g)]
        for s in range(0, len(order), 32):
            idx = order[s:s + 32]
            frames, valid = frames_batch([data.features[i] for i in idx], mean, std)
            loss = F.cross_entropy(model(frames, valid), data.labels[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()

    def accuracy(idx: list[int]) -> float:
        with torch.no_grad():
            frames, valid = frames_batch([data.features[i] for i in idx], mean, std)
            return float((model(frames, valid).argmax(-1) == data.labels[idx]).float().mean())

    return {"train_accuracy": accuracy(train), "test_accuracy": accuracy(test), "train_words": len(train),
            "test_words": len(test), "test_voice": TEST_VOICE, "chance": 1 / len(KEYWORDS), "model": model,
            "data": data, "normalisation": (mean, std)}
