"""A GPT written by hand, in the style of nanoGPT's `model.py` and the course models built like
it: token and learned position embeddings, pre-norm blocks (attention, then a GELU
feed-forward, each with its residual sum), a final norm and a head tied to the token
embedding, trained with `F.cross_entropy` on next-token targets.

What makes it a hand-written model for trainmem's twin is that its layer norm and its
attention's softmax are composed of plain tensor ops, as such models write them:

    layer norm:  centered = x - x.mean(-1);  var = (centered * centered).mean(-1)
                 normed = centered * rsqrt(var + eps);  normed * weight + bias
    softmax:     e = exp(s - s.max(-1));  e / e.sum(-1)

and its attention is either those ops around two matmuls (`sdpa=False`: scores scaled,
future positions filled with -inf, the composed softmax, the weighted sum of the values) or
one call of `torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)`.

Written for trainmem's validation suite from the structure such models publish; it is not a
copy of any of them.
"""

import math

import torch
from torch import nn
from torch.nn import functional as F


def layer_norm(x, weight, bias, eps=1e-5):
    """Layer norm over the last dimension, in plain tensor ops."""
    centered = x - x.mean(dim=-1, keepdim=True)
    var = (centered * centered).mean(dim=-1, keepdim=True)
    normed = centered * torch.rsqrt(var + eps)
    out = normed * weight
    return out if bias is None else out + bias


def softmax(scores):
    """Softmax over the last dimension, in plain tensor ops (the row maximum subtracted)."""
    e = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1, keepdim=True)


class LayerNorm(nn.Module):
    def __init__(self, width, bias=True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.bias = nn.Parameter(torch.zeros(width)) if bias else None

    def forward(self, x):
        return layer_norm(x, self.weight, self.bias)


class SelfAttention(nn.Module):
    def __init__(self, width, heads, seq, bias=True, sdpa=False):
        super().__init__()
        self.heads = heads
        self.sdpa = sdpa
        self.qkv = nn.Linear(width, 3 * width, bias=bias)
        self.out = nn.Linear(width, width, bias=bias)
        # True above the diagonal: the positions a token may not attend to
        future = torch.ones(seq, seq, dtype=torch.bool).triu(diagonal=1)
        self.register_buffer("future", future, persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        d = c // self.heads
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, d).transpose(1, 2) for z in (q, k, v))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
            scores = scores.masked_fill(self.future[:t, :t], float("-inf"))
            y = softmax(scores) @ v
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.out(y)


class FeedForward(nn.Module):
    def __init__(self, width, inner, bias=True):
        super().__init__()
        self.up = nn.Linear(width, inner, bias=bias)
        self.down = nn.Linear(inner, width, bias=bias)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, width, heads, seq, bias, sdpa):
        super().__init__()
        self.norm1 = LayerNorm(width, bias)
        self.attn = SelfAttention(width, heads, seq, bias, sdpa)
        self.norm2 = LayerNorm(width, bias)
        self.ffn = FeedForward(width, 4 * width, bias)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, vocab, seq, layers, width, heads, bias=True, sdpa=False):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads, seq, bias, sdpa) for _ in range(layers))
        self.norm = LayerNorm(width, bias)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tokens.weight  # tied
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.tokens(idx) + self.positions(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
