"""A decoder-only transformer with a catalog model's shapes and seeded random weights.

Same work per decode step as the real model (GQA attention with q/k/v bias where the model has it,
RMSNorm, gated SiLU MLP, embedding and LM head), so its step time, memory and KV traffic are the
real model's; only the numbers in the weights are made up. RoPE (Llama/Qwen2 "rotate_half" form) is
applied to q and k after the QKV projection, and K is cached after rotation as in real models: the
tiers hold what a real engine's cache holds, and offloading rotated K changes nothing about exactness.
Weights are N(0, 1/fan_in) so the residual stream stays O(1) and greedy decoding depends on the
attended context.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import cached_property

from sim.model.spec import ModelSpec

from .qlinear import Linear

NORM_EPS = 1e-6
GATE_UP = 2  # gate and up projections fused in one matrix
LINEARS = ("qkv", "o", "gate_up", "down")  # a layer's projections
BIAS_STD = 0.1  # q/k/v biases: small next to the N(0, 1)-scale projections
ROPE_THETA = 10000.0  # HF default when config.json has no rope_theta


@dataclass(frozen=True)
class ModelShapes:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    qkv_bias: bool = False
    tie_embeddings: bool = False
    rope_theta: float = ROPE_THETA  # changes the numbers only: RoPE's cost does not depend on theta

    @classmethod
    def from_spec(cls, spec, layers: int | None = None) -> "ModelShapes":
        return cls(layers=layers or spec.num_layers, hidden=spec.hidden_size, heads=spec.num_heads,
                   kv_heads=spec.num_kv_heads, head_dim=spec.head_dim, intermediate=spec.intermediate_size,
                   vocab=spec.vocab_size, qkv_bias=spec.qkv_bias, tie_embeddings=spec.tie_embeddings,
                   rope_theta=getattr(spec, "rope_theta", None) or ROPE_THETA)

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.heads // self.kv_heads

    @cached_property
    def spec(self) -> ModelSpec:
        """The architecture this model implements (no q/k norm), for its sizes."""
        return ModelSpec(name="synthetic", num_layers=self.layers, hidden_size=self.hidden, num_heads=self.heads,
                         num_kv_heads=self.kv_heads, intermediate_size=self.intermediate, vocab_size=self.vocab,
                         tie_embeddings=self.tie_embeddings, explicit_head_dim=self.head_dim, qkv_bias=self.qkv_bias)

    @property
    def q_dim(self) -> int:
        return self.spec.q_dim

    @property
    def kv_dim(self) -> int:
        return self.spec.kv_dim

    def layer_params(self) -> int:
        return self.spec.params_layer()

    def non_layer_params(self) -> int:
        """Embedding, final norm and LM head."""
        return self.spec.params - self.layers * self.spec.params_layer()


class Rope:
    """Rotary position embedding over the full head_dim, HF "rotate_half" form (Llama, Qwen2):
    dimension i pairs with i + d/2. Angles in float32; cos/sin cast to the run dtype, as engines do."""

    def __init__(self, head_dim: int, theta: float, device):
        import torch

        self.torch = torch
        self.inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)

    def cos_sin(self, positions, dtype):
        """positions [...] (integers, on the device) -> cos, sin [..., head_dim] in dtype."""
        freqs = positions.float()[..., None] * self.inv_freq
        emb = self.torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def apply(self, x, cos, sin):
        """x [..., head_dim] rotated by angles whose cos/sin broadcast against it."""
        half = x.shape[-1] // 2
        return x * cos + self.torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class SyntheticTransformer:
    def __init__(self, shapes: ModelShapes, device, dtype, seed: int, weight_dtype: str | None = None,
                 group: int = 128):
        """weight_dtype "int4": the layers' projections are weight-only int4 (qlinear.py), as the
        simulator's weight bytes count them; embedding, LM head and norms stay in `dtype`."""
        import torch

        self.torch, self.shapes, self.dtype = torch, shapes, dtype
        self.weight_dtype = weight_dtype  # None: the activation dtype
        self.device = torch.device(device)
        g = torch.Generator(device=self.device).manual_seed(seed)
        s = shapes

        def weight(out_f: int, in_f: int):
            w = torch.randn((out_f, in_f), generator=g, device=self.device, dtype=dtype)
            return w.mul_(in_f ** -0.5)

        def ones(n: int):
            return torch.ones(n, device=self.device, dtype=dtype)

        def linear(out_f: int, in_f: int, bias=None):
            return Linear(weight(out_f, in_f), bias, weight_dtype or "bf16", group, dtype)

        qkv_out = s.q_dim + 2 * s.kv_dim
        self.layers = []
        for _ in range(s.layers):
            self.layers.append({
                "ln1": ones(s.hidden),
                "qkv": linear(qkv_out, s.hidden, torch.randn(qkv_out, generator=g, device=self.device, dtype=dtype)
                              .mul_(BIAS_STD) if s.qkv_bias else None),
                "o": linear(s.hidden, s.q_dim),
                "ln2": ones(s.hidden),
                "gate_up": linear(GATE_UP * s.intermediate, s.hidden),
                "down": linear(s.hidden, s.intermediate),
            })
        self.embedding = torch.randn((s.vocab, s.hidden), generator=g, device=self.device, dtype=dtype)
        self.final_norm = ones(s.hidden)
        self.lm_head = self.embedding if s.tie_embeddings else weight(s.vocab, s.hidden)
        self.rope = Rope(s.head_dim, s.rope_theta, self.device)  # a buffer, not weights: not in the sizes
        self._rope_step = None  # (weakref to the cache, its step, cos, sin): computed once per step

    def tensors(self) -> list:
        """Every weight tensor (norms, biases, packed int4 weights and their scales included)."""
        out = [self.embedding, self.final_norm] + ([] if self.shapes.tie_embeddings else [self.lm_head])
        for p in self.layers:
            out += [p["ln1"], p["ln2"]] + [t for key in LINEARS for t in p[key].tensors]
            out += [p["qkv"].bias] if p["qkv"].bias is not None else []
        return out

    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def non_layer_bytes(self) -> int:
        return self.shapes.non_layer_params() * self.torch.empty((), dtype=self.dtype).element_size()

    # ---- pieces of a decode step --------------------------------------------------------------
    def embed(self, tokens):
        return self.embedding[tokens]

    def _norm(self, x, w):
        return self.torch.nn.functional.rms_norm(x, (x.shape[-1],), w, NORM_EPS)

    def _mlp(self, x, p):
        F = self.torch.nn.functional
        gate, up = p["gate_up"](self._norm(x, p["ln2"])).chunk(2, dim=-1)
        return x + p["down"](F.silu(gate) * up)

    def rope_for_step(self, cache):
        """cos, sin [B, 1, head_dim] at each row's new token (position n - 1 after begin_step), computed
        once per step of a cache and shared by its layers, as real models do."""
        r = self._rope_step
        if r is None or r[0]() is not cache or r[1] != cache.step:
            pos = self.torch.from_numpy(cache.n - 1)  # inactive rows: their last position (unused)
            if self.device.type == "cuda":  # a fresh pinned block: the caching host allocator keeps it until copied
                pos = pos.pin_memory()
            cos, sin = self.rope.cos_sin(pos.to(self.device, non_blocking=True), self.dtype)
            r = self._rope_step = (weakref.ref(cache), cache.step, cos[:, None], sin[:, None])
        return r[2], r[3]

    def _qkv_heads(self, x, p):
        """x [..., hidden] -> [..., heads + 2 kv_heads, head_dim]: q heads, then k, then v."""
        s = self.shapes
        qkv = p["qkv"](self._norm(x, p["ln1"]))
        return qkv.view(*x.shape[:-1], s.heads + 2 * s.kv_heads, s.head_dim)

    def layer(self, index: int, x, cache):
        """One layer for one new token per row: x [B, hidden]."""
        s, p = self.shapes, self.layers[index]
        cos, sin = self.rope_for_step(cache)
        cache.layer_start(index)
        heads = self._qkv_heads(x, p)
        qk = self.rope.apply(heads[:, : s.heads + s.kv_heads], cos, sin)  # q and k in one pass: fewer launches
        q, k = qk.split((s.heads, s.kv_heads), dim=1)
        b = x.shape[0]
        o = cache.attend(index, q.view(b, s.kv_heads, s.group, s.head_dim), k, heads[:, s.heads + s.kv_heads:])
        x = x + p["o"](o.reshape(b, s.q_dim))
        return self._mlp(x, p)

    def head(self, x):
        F = self.torch.nn.functional
        return F.linear(self._norm(x, self.final_norm), self.lm_head).float()

    def decode_step(self, tokens, cache):
        """tokens [B] -> logits [B, vocab] (float32); the caller brackets begin/end_step."""
        x = self.embed(tokens)
        for i in range(self.shapes.layers):
            x = self.layer(i, x, cache)
        return self.head(x)

    def prefill(self, prompt, cache):
        """prompt [B, P] -> logits of the last position; writes the prompt's K/V into the cache."""
        F, s = self.torch.nn.functional, self.shapes
        b, n = prompt.shape
        cos, sin = self.rope.cos_sin(self.torch.arange(n, device=self.device), self.dtype)
        cos, sin = cos[:, None], sin[:, None]  # [P, 1, d]: broadcast over heads
        x = self.embed(prompt)
        for i, p in enumerate(self.layers):
            heads = self._qkv_heads(x, p)  # [B, P, heads + 2 kv_heads, d]
            qk = self.rope.apply(heads[:, :, : s.heads + s.kv_heads], cos, sin)
            q = qk[:, :, : s.heads].transpose(1, 2)
            k = qk[:, :, s.heads:].transpose(1, 2)
            v = heads[:, :, s.heads + s.kv_heads:].transpose(1, 2)
            cache.write_prompt(i, k, v)  # rotated K, as real models cache it
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + p["o"](o.transpose(1, 2).reshape(b, n, s.q_dim))
            x = self._mlp(x, p)
        return self.head(x[:, -1])
