"""Real training for bench_chunking.py: a BERT encoder (all-MiniLM-L6-v2's real weights, or a
tiny one of the same code) fine-tuned with Adam on real text, in the scenarios of issue 27.

The model is written here, with the parameter names of the safetensors file of
``restorepoint.testing.weights``, so that the real weights load strictly without importing
transformers (whose import alone takes longer than the benchmark's smoke test may). The text
is this repository's documentation, cut into windows of word pieces of the model's own
vocabulary; a window's label says whether it comes from the spec.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from restorepoint.testing.weights import model_dir, safetensors_state_dict

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = {
    "full": "full fine-tune: every parameter trains (Adam)",
    "frozen": "frozen backbone: only the last layer, the pooler and a head train (Adam)",
    "frozen-rng": "the frozen backbone, and each step draws 1000 numbers from Python's and "
    "numpy's global RNGs, as per-sample augmentation does (their states are in the runtime "
    "file's JSON header)",
    "embedding": "embedding table: the word embeddings train sparsely (SparseAdam), a step "
    "touches the rows of its batch; the head trains (Adam); the encoder is frozen",
    "external": "external trainer: a full fine-tune's torch.save checkpoint (the newest only) "
    "beside unchanged data: the pretrained weights, the tokenizer, the tokenized corpus",
}


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int = 30522
    positions: int = 512


MINILM = Shape(hidden=384, layers=6, heads=12, intermediate=1536)
TINY = Shape(hidden=32, layers=2, heads=2, intermediate=64)


def _module(**children: nn.Module) -> nn.Module:
    out = nn.Module()
    for name, child in children.items():
        out.add_module(name, child)
    return out


class Layer(nn.Module):
    def __init__(self, s: Shape) -> None:
        super().__init__()
        h = s.hidden
        self.heads = s.heads
        self.attention = _module(
            self=_module(query=nn.Linear(h, h), key=nn.Linear(h, h), value=nn.Linear(h, h)),
            output=_module(dense=nn.Linear(h, h), LayerNorm=nn.LayerNorm(h, eps=1e-12)),
        )
        self.intermediate = _module(dense=nn.Linear(h, s.intermediate))
        self.output = _module(
            dense=nn.Linear(s.intermediate, h), LayerNorm=nn.LayerNorm(h, eps=1e-12)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        att: Any = self.attention

        def split(layer: nn.Module) -> torch.Tensor:
            return layer(x).view(b, t, self.heads, h // self.heads).transpose(1, 2)

        q, k, v = split(att.self.query), split(att.self.key), split(att.self.value)
        ctx = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, h)
        x = att.output.LayerNorm(x + att.output.dense(ctx))
        inner = F.gelu(self.intermediate.dense(x))  # type: ignore[operator]
        out: Any = self.output
        return out.LayerNorm(x + out.dense(inner))  # type: ignore[no-any-return]


class Bert(nn.Module):
    """A BERT encoder with a pooler and a two-class head."""

    def __init__(self, s: Shape) -> None:
        super().__init__()
        h = s.hidden
        self.embeddings = _module(
            word_embeddings=nn.Embedding(s.vocab, h),
            position_embeddings=nn.Embedding(s.positions, h),
            token_type_embeddings=nn.Embedding(2, h),
            LayerNorm=nn.LayerNorm(h, eps=1e-12),
        )
        self.embeddings.register_buffer("position_ids", torch.arange(s.positions)[None])
        self.encoder = _module(layer=nn.ModuleList(Layer(s) for _ in range(s.layers)))
        self.pooler = _module(dense=nn.Linear(h, h))
        self.classifier = nn.Linear(h, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        e: Any = self.embeddings
        positions = e.position_ids[:, : ids.shape[1]]
        x = e.word_embeddings(ids) + e.position_embeddings(positions)
        x = e.LayerNorm(x + e.token_type_embeddings(torch.zeros_like(ids)))
        for layer in self.encoder.layer:  # type: ignore[union-attr]
            x = layer(x)
        pooled = torch.tanh(self.pooler.dense(x[:, 0]))  # type: ignore[operator]
        return self.classifier(pooled)  # type: ignore[no-any-return]


def build_model(kind: str, seed: int = 0) -> Bert:
    torch.manual_seed(seed)
    if kind == "minilm":
        model = Bert(MINILM)
        missing = model.load_state_dict(safetensors_state_dict(), strict=False)
        # The real weights hold everything but the new head.
        assert set(missing.missing_keys) == {"classifier.weight", "classifier.bias"}, missing
        assert not missing.unexpected_keys, missing
        return model
    return Bert(TINY)


def prepare(model: Bert, scenario: str) -> list[torch.optim.Optimizer]:
    """Freeze what the scenario freezes; the optimizers of what trains."""
    lr = 2e-5
    model.requires_grad_(scenario in {"full", "external"})
    if scenario in {"full", "external"}:
        return [torch.optim.Adam(model.parameters(), lr=lr)]
    head = [*model.pooler.parameters(), *model.classifier.parameters()]
    if scenario in {"frozen", "frozen-rng"}:
        last = model.encoder.layer[-1]  # type: ignore[index]
        trained = [*last.parameters(), *head]
        for p in trained:
            p.requires_grad_(True)
        return [torch.optim.Adam(trained, lr=lr)]
    word: Any = model.embeddings.word_embeddings
    word.sparse = True
    word.weight.requires_grad_(True)
    for p in head:
        p.requires_grad_(True)
    return [torch.optim.SparseAdam([word.weight], lr=1e-3), torch.optim.Adam(head, lr=lr)]


def trained_fraction(model: Bert) -> float:
    total = sum(p.numel() for p in model.parameters())
    return sum(p.numel() for p in model.parameters() if p.requires_grad) / total


# -- the data --------------------------------------------------------------------------------


def vocab() -> dict[str, int]:
    lines = (model_dir() / "vocab.txt").read_text(encoding="utf-8").splitlines()
    return {word: i for i, word in enumerate(lines)}


def word_pieces(text: str, table: dict[str, int]) -> list[int]:
    """BERT's uncased word-piece split, greedy longest match (enough for real token ids)."""
    unk = table["[UNK]"]
    out: list[int] = []
    for word in re.findall(r"\w+|[^\w\s]", text.lower()):
        start, pieces = 0, []
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in table:
                    pieces.append(table[piece])
                    break
                end -= 1
            if end == start:
                pieces = [unk]
                break
            start = end
        out.extend(pieces)
    return out


def corpus(seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(windows of token ids, labels): the repository's docs, spec and README."""
    table = vocab()
    files = sorted((REPO / "docs").glob("*.md")) + sorted((REPO / "spec").glob("*.md"))
    files.append(REPO / "README.md")
    windows, labels = [], []
    for path in files:
        ids = word_pieces(path.read_text(encoding="utf-8"), table)
        body = seq - 1
        for start in range(0, len(ids) - body + 1, body):
            windows.append([table["[CLS]"], *ids[start : start + body]])
            labels.append(int(path.parent.name == "spec"))
    return torch.tensor(windows), torch.tensor(labels)


def batches(seq: int, batch: int, count: int, seed: int = 0) -> list[tuple[torch.Tensor, ...]]:
    x, y = corpus(seq)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    out = []
    for i in range(count):
        idx = order[(i * batch) % len(x) :][:batch]
        out.append((x[idx], y[idx]))
    return out


#: Numbers each step of a ``-rng`` scenario draws from Python's and from numpy's global RNG.
DRAWS = 1000


def augment(scenario: str) -> None:
    """What per-sample augmentation draws from the global RNGs, in the ``-rng`` scenarios.
    Their Mersenne Twisters regenerate their 624 words every 312 doubles, so over the steps
    between two checkpoints the decimal text of their states changes, and with it the length
    of the runtime file's JSON header."""
    if scenario.endswith("-rng"):
        import random

        import numpy as np

        for _ in range(DRAWS):
            random.random()
        np.random.random(DRAWS)


def train_step(
    model: Bert, optimizers: list[torch.optim.Optimizer], batch: tuple[torch.Tensor, ...]
) -> float:
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(batch[0]), batch[1])
    loss.backward()  # type: ignore[no-untyped-call]
    for opt in optimizers:
        opt.step()
    return float(loss)


def data_files(root: Path, model_kind: str, initial: dict[str, torch.Tensor]) -> None:
    """What an external trainer keeps beside its checkpoints and never changes."""
    from safetensors.torch import save_file

    (root / "pretrained").mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in initial.items()}, root / "pretrained/model.safetensors"
    )
    (root / "data").mkdir(exist_ok=True)
    x, _ = corpus(128)
    (root / "data/tokens.bin").write_bytes(x.to(torch.int32).numpy().tobytes())
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "config.json"):
        (root / "data" / name).write_bytes((model_dir() / name).read_bytes())
    (root / "data/model.json").write_text(json.dumps({"model": model_kind}), encoding="utf-8")
