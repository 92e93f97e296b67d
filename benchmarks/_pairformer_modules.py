"""The Pairformer block of ``pairformer.py``, written the usual way (OpenFold / AF3 supplement).

One module code serves every method: a dense pair ``(B, N, N, C)`` (``padded``, with masks), a
dense ``(1, N, N, C)`` sample (``loop``, no masks) and a multi_jagged ``(B, j0, j0, C)`` pair
(``ours``, no masks). The masks are OpenFold's: ``mask`` arguments are ``None`` for unpadded
inputs, so the code the nested tensor runs is the code a user writes for one unpadded sample.

AF3 supplement algorithm numbers:

* ``TriangleMultiplication`` — Algorithms 12 (outgoing) and 13 (incoming),
* ``TriangleAttention``      — Algorithms 14 (starting node) and 15 (ending node),
* ``Transition``             — Algorithm 11 (SwiGLU, factor 4),
* ``AttentionPairBias``      — Algorithm 24 without the adaptive LayerNorm conditioning (the
                               Pairformer's single update, Algorithm 17 line 6),
* ``PairformerBlock``        — Algorithm 17 (dropout omitted: the benchmark is deterministic).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

# OpenFold's ``inf`` for mask biases: large enough that exp(-1e9 + x) is exactly 0 in float32
# and float64, finite so that a row whose keys are all padding gives a uniform softmax, not nan.
MASK_INF = 1e9


class TriangleMultiplication(nn.Module):
    """z_ij ← g_ij ⊙ Linear(LN(Σ_k a_ik b_jk)) (outgoing) or Σ_k a_ki b_kj (incoming)."""

    def __init__(self, c_z: int, c_hidden: int, outgoing: bool):
        super().__init__()
        self.outgoing = outgoing
        self.norm_in = nn.LayerNorm(c_z)
        self.proj_ab = nn.Linear(c_z, 2 * c_hidden)
        self.gate_ab = nn.Linear(c_z, 2 * c_hidden)
        self.norm_out = nn.LayerNorm(c_hidden)
        self.proj_out = nn.Linear(c_hidden, c_z)
        self.gate_out = nn.Linear(c_z, c_z)

    def forward(self, z: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        z = self.norm_in(z)
        ab = torch.sigmoid(self.gate_ab(z)) * self.proj_ab(z)
        if mask is not None:  # (…, N, N): padded cells must not enter the sum over k
            ab = ab * mask.unsqueeze(-1)
        a, b = ab.chunk(2, -1)
        if self.outgoing:
            x = torch.einsum("...ikc,...jkc->...ijc", a, b)
        else:
            x = torch.einsum("...kic,...kjc->...ijc", a, b)
        return torch.sigmoid(self.gate_out(z)) * self.proj_out(self.norm_out(x))


class TriangleAttention(nn.Module):
    """Starting node: every row i of the pair attends along its columns, with a pair bias shared
    by the rows; ending node: the same on the transposed pair. Input ``(B, N, N, C)``."""

    def __init__(self, c_z: int, c_hidden: int, heads: int, starting: bool):
        super().__init__()
        self.starting, self.heads = starting, heads
        self.norm = nn.LayerNorm(c_z)
        self.qkv = nn.Linear(c_z, 3 * heads * c_hidden, bias=False)
        self.bias = nn.Linear(c_z, heads, bias=False)
        self.gate = nn.Linear(c_z, heads * c_hidden)
        self.out = nn.Linear(heads * c_hidden, c_z)

    def forward(self, z: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if not self.starting:
            z = z.transpose(-2, -3)
            mask = None if mask is None else mask.transpose(-1, -2)
        z = self.norm(z)
        q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(-2, -3) for t in self.qkv(z).chunk(3, -1))  # (B, I, H, J, d)
        bias = self.bias(z).permute(0, 3, 1, 2).unsqueeze(1)  # (B, 1, H, J, J): shared by the rows i
        if mask is not None:  # (B, I, J) → key-padding bias (B, I, 1, 1, J), as OpenFold
            bias = bias + (MASK_INF * (mask - 1))[:, :, None, None, :]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)  # (B, I, H, J, d)
        o = torch.sigmoid(self.gate(z)) * o.transpose(-2, -3).flatten(-2)
        o = self.out(o)
        return o if self.starting else o.transpose(-2, -3)


class Transition(nn.Module):
    """SwiGLU transition, hidden ``n · c`` (AF3 Algorithm 11, n = 4)."""

    def __init__(self, c: int, n: int = 4):
        super().__init__()
        self.norm = nn.LayerNorm(c)
        self.ab = nn.Linear(c, 2 * n * c, bias=False)
        self.out = nn.Linear(n * c, c, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.ab(self.norm(x)).chunk(2, -1)
        return self.out(F.silu(a) * b)


class AttentionPairBias(nn.Module):
    """Singles ``(B, N, C_s)`` attend with a bias ``(B, H, N, N)`` projected from the pair."""

    def __init__(self, c_s: int, c_z: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm_s = nn.LayerNorm(c_s)
        self.norm_z = nn.LayerNorm(c_z)
        self.q = nn.Linear(c_s, c_s)
        self.kv = nn.Linear(c_s, 2 * c_s, bias=False)
        self.bias = nn.Linear(c_z, heads, bias=False)
        self.gate = nn.Linear(c_s, c_s, bias=False)
        self.out = nn.Linear(c_s, c_s, bias=False)

    def forward(self, s: torch.Tensor, z: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        a = self.norm_s(s)
        k, v = self.kv(a).chunk(2, -1)
        q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(-2, -3) for t in (self.q(a), k, v))  # (B, H, N, d)
        bias = self.bias(self.norm_z(z)).permute(0, 3, 1, 2)  # (B, H, N, N)
        if mask is not None:  # (B, N) → key-padding bias (B, 1, 1, N)
            bias = bias + (MASK_INF * (mask - 1))[:, None, None, :]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=bias).transpose(-2, -3).flatten(-2)  # (B, N, C_s)
        return self.out(torch.sigmoid(self.gate(a)) * o)


class PairformerBlock(nn.Module):
    """AF3 Algorithm 17: the pair stack, then the single update with pair bias."""

    def __init__(self, c_s: int, c_z: int, c_hidden_mul: int, c_hidden_att: int, heads_pair: int, heads_single: int):
        super().__init__()
        self.tri_mul_out = TriangleMultiplication(c_z, c_hidden_mul, outgoing=True)
        self.tri_mul_in = TriangleMultiplication(c_z, c_hidden_mul, outgoing=False)
        self.tri_att_start = TriangleAttention(c_z, c_hidden_att, heads_pair, starting=True)
        self.tri_att_end = TriangleAttention(c_z, c_hidden_att, heads_pair, starting=False)
        self.pair_transition = Transition(c_z)
        self.single_attention = AttentionPairBias(c_s, c_z, heads_single)
        self.single_transition = Transition(c_s)

    def forward(self, s: torch.Tensor, z: torch.Tensor, single_mask: Optional[torch.Tensor] = None,
                pair_mask: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        z = z + self.tri_mul_out(z, pair_mask)
        z = z + self.tri_mul_in(z, pair_mask)
        z = z + self.tri_att_start(z, pair_mask)
        z = z + self.tri_att_end(z, pair_mask)
        z = z + self.pair_transition(z)
        s = s + self.single_attention(s, z, single_mask)
        s = s + self.single_transition(s)
        return s, z
