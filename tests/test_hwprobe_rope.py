"""RoPE in the synthetic model: the rotation's properties, and decode through the real cache at the
right positions (prefill of P+1 tokens == prefill of P tokens + one decode step)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hwprobe.cache import CacheGeometry, CacheOptions, Runtime, TieredKVCache  # noqa: E402
from hwprobe.model.synthetic import ModelShapes, Rope, SyntheticTransformer  # noqa: E402
from sim.tiering.tiers import TierPolicy  # noqa: E402

HEAD_DIM = 16
SHAPES = ModelShapes(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=HEAD_DIM, intermediate=128, vocab=97)
PROMPT_TOKENS = 12
LOGIT_TOL = 1e-4


def _rope():
    return Rope(HEAD_DIM, 10000.0, "cpu")


def _rotate(rope, x, positions):
    cos, sin = rope.cos_sin(torch.as_tensor(positions), torch.float32)
    return rope.apply(x, cos, sin)


def test_position_zero_is_identity():
    x = torch.randn(5, HEAD_DIM, generator=torch.Generator().manual_seed(0))
    assert torch.equal(_rotate(_rope(), x, [0] * 5), x)


def test_rotation_preserves_each_pairs_norm():
    rope, half = _rope(), HEAD_DIM // 2
    x = torch.randn(7, HEAD_DIM, generator=torch.Generator().manual_seed(1))
    y = _rotate(rope, x, [1, 2, 3, 17, 100, 1000, 30000])
    pair_norm = lambda t: t[:, :half] ** 2 + t[:, half:] ** 2  # noqa: E731 - dimension i pairs with i + d/2
    assert torch.allclose(pair_norm(y), pair_norm(x), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(y, x)


def test_dot_product_depends_only_on_position_difference():
    rope = _rope()
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(HEAD_DIM, generator=g), torch.randn(HEAD_DIM, generator=g)

    def score(m, n):
        return float(_rotate(rope, q, m) @ _rotate(rope, k, n))

    for m, n in ((5, 2), (40, 37), (1003, 1000)):  # all differ by 3
        assert score(m, n) == pytest.approx(score(3, 0), rel=1e-4, abs=1e-4)
    assert score(6, 2) != pytest.approx(score(3, 0), rel=1e-3)


def test_theta_comes_from_the_spec_or_defaults():
    class Spec:
        num_layers, hidden_size, num_heads, num_kv_heads, head_dim = 2, 64, 4, 2, 16
        intermediate_size, vocab_size, qkv_bias, tie_embeddings = 128, 97, True, False

    assert ModelShapes.from_spec(Spec()).rope_theta == 10000.0
    Spec.rope_theta = 1e6
    assert ModelShapes.from_spec(Spec()).rope_theta == 1e6


def _cache(model, batch: int, prompt_tokens: int, steps):
    """A full_hbm cache; steps: decode steps of every row, or a list per row."""
    s = model.shapes
    geom = CacheGeometry(s.layers, batch, s.kv_heads, s.head_dim)
    lengths = steps if isinstance(steps, list) else [steps] * batch
    return TieredKVCache(Runtime("cpu"), geom, TierPolicy(kind="full_hbm"), CacheOptions(), prompt_tokens,
                         lengths, torch.float32)


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_decode_step_matches_prefill_of_one_more_token(qkv_bias):
    """A wrong decode position (off by one, or the step instead of the row's length) breaks this."""
    shapes = ModelShapes(**{**SHAPES.__dict__, "qkv_bias": qkv_bias})
    model = SyntheticTransformer(shapes, "cpu", torch.float32, seed=0)
    tokens = torch.randint(0, shapes.vocab, (2, PROMPT_TOKENS + 1), generator=torch.Generator().manual_seed(3))
    want = model.prefill(tokens, _cache(model, 2, PROMPT_TOKENS + 1, 1))

    cache = _cache(model, 2, PROMPT_TOKENS, 1)
    prefill_logits = model.prefill(tokens[:, :PROMPT_TOKENS], cache)
    cache.begin_step()
    got = model.decode_step(tokens[:, PROMPT_TOKENS], cache)
    cache.end_step()
    assert torch.allclose(got, want, rtol=0, atol=LOGIT_TOL), (got - want).abs().max()
    assert not torch.allclose(prefill_logits, want, atol=LOGIT_TOL)  # the comparison sees the new token


def test_each_decode_step_matches_prefill_with_a_finished_row():
    """Several steps through one cache (cos/sin recomputed as the step advances); row 0 finishes after
    one step, row 1 keeps decoding at its own positions."""
    model = SyntheticTransformer(SHAPES, "cpu", torch.float32, seed=1)
    steps = 4
    tokens = torch.randint(0, SHAPES.vocab, (2, PROMPT_TOKENS + steps), generator=torch.Generator().manual_seed(4))
    cache = _cache(model, 2, PROMPT_TOKENS, [1, steps])
    model.prefill(tokens[:, :PROMPT_TOKENS], cache)
    for t in range(steps):
        n = PROMPT_TOKENS + t + 1
        want = model.prefill(tokens[:, :n], _cache(model, 2, n, 1))
        cache.begin_step()
        got = model.decode_step(tokens[:, n - 1], cache)
        cache.end_step()
        rows = slice(0, 2) if t == 0 else slice(1, 2)
        assert torch.allclose(got[rows], want[rows], rtol=0, atol=LOGIT_TOL), (t, (got - want).abs().max())
