"""The networks against HF transformers' ELECTRA, and where gradients may flow between G and D."""
import dataclasses
import functools

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax import config as config_lib
from electra_jax.data.special_ids import SpecialIds
from electra_jax.model import modeling, objectives
from electra_jax.pretrain import experiment


def _init(config, objective="electra"):
  config.objective.name = objective
  model = modeling.Electra(modeling.ModelConfig.from_config(config))
  return model, jax.eval_shape(lambda: objectives.init_params(model, objective, config.data.seq_len, jax.random.key(0)))


def test_small_parameter_counts_equal_hf():
  import transformers  # pylint: disable=g-import-not-at-top  (the reference; installed by make test)
  c = config_lib.base("small")
  c.data.vocab_size = 30522
  mc = modeling.ModelConfig.from_config(c)
  _, params = _init(c)
  params = {k: sum(x.size for x in jax.tree.leaves(v)) for k, v in params.items()}

  def hf(e, cls):
    return cls(transformers.ElectraConfig(
        vocab_size=mc.vocab_size, embedding_size=mc.embedding_size, hidden_size=e.hidden_size,
        num_hidden_layers=e.num_layers, num_attention_heads=e.num_heads, intermediate_size=e.intermediate_size)
    ).num_parameters()

  assert "generator_embeddings" not in params and "discriminator_embeddings" not in params
  shared = params["embeddings"]
  assert params["discriminator"] + params["discriminator_head"] + shared == hf(
      mc.discriminator, transformers.ElectraForPreTraining)
  assert params["generator"] + params["generator_head"] + shared == hf(mc.generator, transformers.ElectraForMaskedLM)


@pytest.mark.parametrize("sharing,expected", [
    ("shared", {"embeddings", "generator", "discriminator", "generator_head", "discriminator_head"}),
    ("untied", {"generator_embeddings", "discriminator_embeddings", "generator", "discriminator",
                "generator_head", "discriminator_head"}),
    ("all", {"embeddings", "discriminator", "generator_head", "discriminator_head"}),
])
def test_parameter_tree_per_sharing_mode(sharing, expected):
  c = config_lib.base("tiny")
  c.data.update(vocab_size=100, seq_len=16)
  c.objective.embedding_sharing = sharing
  if sharing == "all":
    c.model.generator_fraction = 1.0
  assert set(_init(c)[1]) == expected


def test_mlm_objective_has_no_generator():
  c = config_lib.base("tiny")
  c.data.update(vocab_size=100, seq_len=16)
  assert set(_init(c, "mlm")[1]) == {"embeddings", "discriminator", "discriminator_mlm_head"}


def test_bad_model_configs_fail_clearly():
  c = config_lib.base("tiny")
  c.data.seq_len = 1024
  with pytest.raises(ValueError, match="position table"):
    modeling.ModelConfig.from_config(c)
  c = config_lib.base("tiny")
  c.objective.embedding_sharing = "all"
  with pytest.raises(ValueError, match="generator_fraction=1.0"):
    modeling.ModelConfig.from_config(c)


@functools.lru_cache(maxsize=None)
def _tiny(sharing="shared"):
  """A tiny experiment on one device, its initial params, and its loss metrics jitted as f(params, batch)."""
  c = config_lib.base("tiny")
  c.data.update(vocab_size=64, seq_len=16)
  c.train.update(batch_size=8, num_steps=10, warmup_steps=2)
  c.objective.embedding_sharing = sharing
  c.mesh.update(data=1, fsdp=1)
  exp = experiment.create(c, SpecialIds(), devices=jax.devices()[:1])
  metrics = jax.jit(lambda p, b: objectives.compute_loss(exp.model, p, b, jax.random.key(3), exp.objective,
                                                         exp.special)[1])
  return exp, exp.sharded.init(jax.random.key(0)).params, metrics


def _batch(token=7):
  ids = np.full((8, 16), token, np.int32)
  ids[:, 0], ids[:, -1] = 2, 3
  ids[:4, 10:] = 0
  return {"input_ids": jnp.asarray(ids), "segment_ids": jnp.zeros((8, 16), jnp.int32)}


def _all_zero(tree):
  return all(not np.any(np.asarray(x)) for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("sharing", ["shared", "untied", "gdes"])
def test_discriminator_loss_never_reaches_the_generator(sharing):
  _, params, metrics = _tiny(sharing)
  grads = jax.grad(lambda p: metrics(p, _batch())["disc_loss"])(params)
  assert _all_zero(grads["generator"]) and _all_zero(grads["generator_head"])
  assert not _all_zero(grads["discriminator"])
  if sharing == "gdes":  # E_G is trained by the MLM loss only; D learns through its zero-initialised delta
    assert _all_zero(grads["generator_embeddings"])
    assert not _all_zero(grads["discriminator_embeddings"]["word_embeddings_delta"])
    np.testing.assert_array_equal(params["discriminator_embeddings"]["word_embeddings_delta"], 0)


@pytest.mark.parametrize("favoured,replaced", [(7, False), (8, True)])
def test_a_correct_sample_is_labelled_real(favoured, replaced):
  _, params, metrics = _tiny()
  # Make the generator certain of one token: the original (7) or another (8).
  params = dict(params, generator_head=dict(params["generator_head"],
                                            bias=params["generator_head"]["bias"].at[favoured].set(1e4)))
  fraction = float(metrics(params, _batch(7))["replaced_fraction"])
  if replaced:
    assert fraction > 0.05
  else:
    assert fraction == 0.0


def _attention_config(impl="einsum", dtype="float32"):
  c = config_lib.base("tiny")  # D: 2 heads of 32, G: 1 head of 32
  c.data.update(vocab_size=100, seq_len=32)
  c.model.update(attention_impl=impl, dtype=dtype, attention_dropout_rate=0.0)
  return c


@functools.lru_cache(maxsize=None)
def _attention_inputs():
  """Params (every leaf perturbed, so LayerNorms and biases matter; Q and K enough for peaked, trained-like
  attention rather than a near-uniform one that hides a wrong scale) and a batch shaped like packed data: full rows
  and rows padded from 9, 20 or 31 on, so that an unmasked pad would change the outputs."""
  c = _attention_config()
  params = flax.core.meta.unbox(objectives.init_params(modeling.Electra(modeling.ModelConfig.from_config(c)),
                                                       c.objective.name, c.data.seq_len, jax.random.key(0)))
  rng = np.random.default_rng(0)
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: x + (0.2 if path[-2].key in ("query", "key") else 0.05) *
      rng.standard_normal(x.shape).astype(np.float32), params)
  ids = rng.integers(5, 100, (8, 32)).astype(np.int32)
  for row, length in enumerate([32, 9, 32, 20, 31, 32, 9, 20]):
    ids[row, length:] = 0
  segments = (np.arange(32) >= 12).astype(np.int32)[None].repeat(8, 0)
  positions = np.stack([rng.choice(8, 5, replace=False) for _ in range(8)]).astype(np.int32)
  return params, jnp.asarray(ids), jnp.asarray(segments), jnp.asarray(positions)


def _attention_outputs(impl, dtype="float32", **model_options):
  """(discriminator logits, generator logits, grads of a scalar loss of both w.r.t. every param), freshly traced."""
  params, ids, segments, positions = _attention_inputs()
  c = _attention_config(impl, dtype)
  c.model.update(model_options)
  model = modeling.Electra(modeling.ModelConfig.from_config(c))

  def loss(p):
    disc = model.apply({"params": p}, ids, segments, method=model.discriminator_logits)
    gen = model.apply({"params": p}, ids, segments, positions, method=model.generator_logits)
    return jnp.mean(jnp.sin(disc)) + jnp.mean(jax.nn.log_softmax(gen)[..., 7]), (disc, gen)

  (_, (disc, gen)), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  return disc, gen, grads


def _max_diffs(a, b):
  """Max |a - b| per output: discriminator logits, generator logits, and over every gradient leaf."""
  return tuple(max(float(jnp.max(jnp.abs(x.astype(jnp.float32) - y.astype(jnp.float32))))
                   for x, y in zip(jax.tree.leaves(u), jax.tree.leaves(v))) for u, v in zip(a, b))


def _break_fused(monkeypatch, broken):
  """jax.nn.dot_product_attention without its padding lengths (broken="mask") or with the default scale of 1 (broken="scale"):
  the mistakes the tolerances below must catch."""
  fused = jax.nn.dot_product_attention
  def wrong(q, k, v, key_value_seq_lengths=None, scale=None, **kw):
    return fused(q, k, v, key_value_seq_lengths=None if broken == "mask" else key_value_seq_lengths,
                 scale=1.0 if broken == "scale" else scale, **kw)
  monkeypatch.setattr(jax.nn, "dot_product_attention", wrong)


def test_fused_attention_refuses_attention_dropout():
  """The fused path has no attention dropout (docs/fidelity.md): a non-zero rate is refused in one line, not dropped."""
  c = config_lib.base("tiny")
  c.model.attention_impl = "fused"
  with pytest.raises(ValueError, match=r"cannot drop attention probabilities .* set model.attention_dropout_rate=0 "
                     r"\(got 0.1\) or use model.attention_impl=einsum$"):
    modeling.ModelConfig.from_config(c)
  c.model.attention_dropout_rate = 0.0
  assert modeling.ModelConfig.from_config(c).attention_impl == "fused"


def test_fused_attention_equals_einsum_in_float32(monkeypatch):
  einsum = _attention_outputs("einsum")
  assert max(_max_diffs(_attention_outputs("fused"), einsum)) < 1e-5
  for broken in ("mask", "scale"):
    with monkeypatch.context() as m:
      _break_fused(m, broken)
      assert min(_max_diffs(_attention_outputs("fused"), einsum)) > 1e-3, broken


def test_fused_attention_in_bfloat16_is_as_close_to_float32_as_einsum(monkeypatch):
  """bf16 keeps 8 mantissa bits, so neither path equals float32 (or each other) to 1e-5. Both are measured against
  the float32 result instead, per output: the fused path rounds where the einsum one does (its logits stay float32,
  if anything more exact), so it may err at most 2x as much (measured: ~1.05x). A missing mask or scale errs far
  more (checked; measured ~5x on the gradients, 10-18x on the logits), so the bound cannot pass trivially."""
  reference = _attention_outputs("einsum")
  einsum_error = _max_diffs(_attention_outputs("einsum", "bfloat16"), reference)
  assert all(0 < e < 0.1 for e in einsum_error), einsum_error  # bf16 really ran, and is close
  fused_error = _max_diffs(_attention_outputs("fused", "bfloat16"), reference)
  assert all(f <= 2 * e for f, e in zip(fused_error, einsum_error)), (fused_error, einsum_error)
  for broken in ("mask", "scale"):
    with monkeypatch.context() as m:
      _break_fused(m, broken)
      broken_error = _max_diffs(_attention_outputs("fused", "bfloat16"), reference)
      assert all(b > 2 * e for b, e in zip(broken_error, einsum_error)), (broken, broken_error, einsum_error)


def test_fused_attention_with_dropout_set_after_from_config_takes_the_einsum_path():
  """Fine-tuning replaces attention_dropout_rate after from_config: its training steps drop through the einsum path."""
  params, ids, segments, _ = _attention_inputs()
  mc = modeling.ModelConfig.from_config(_attention_config("fused"))
  out = [modeling.Electra(dataclasses.replace(mc, attention_impl=impl, attention_dropout_rate=0.1)).apply(
      {"params": params}, ids, segments, deterministic=False, method=modeling.Electra.discriminator_logits,
      rngs={"dropout": jax.random.key(1)}) for impl in ("einsum", "fused")]
  np.testing.assert_array_equal(out[0], out[1])


def test_attention_impl_config_errors_name_the_key():
  c = _attention_config("flash")
  with pytest.raises(ValueError, match=r"model.attention_impl='flash': expected one of einsum, fused"):
    modeling.ModelConfig.from_config(c)
  c = _attention_config("fused")
  c.model.attention_dropout_rate = 0.1
  with pytest.raises(ValueError, match=r"model.attention_impl='fused'.*model.attention_dropout_rate=0"):
    modeling.ModelConfig.from_config(c)


def test_scanned_layers_are_the_unrolled_layers():
  """model.scan_layers runs the same layers, from the same per-layer parameters (checkpoints and exports unchanged):
  equal hidden states and gradients with dropout off, and a training forward that draws its dropout, attention's
  included, the same masks as the unrolled layers'."""
  c = config_lib.base("tiny")
  c.model.update(num_layers=3, remat=True)
  c.data.update(vocab_size=100, seq_len=16)
  unrolled = modeling.Electra(modeling.ModelConfig.from_config(c))
  init = lambda model: objectives.init_params(model, c.objective.name, c.data.seq_len, jax.random.key(0))
  params = flax.linen.meta.unbox(init(unrolled))
  scanned = modeling.Electra(dataclasses.replace(unrolled.config, scan_layers=True))
  assert jax.tree.structure(jax.eval_shape(lambda: init(scanned))) == \
      jax.tree.structure(jax.eval_shape(lambda: init(unrolled)))
  ids = jnp.asarray(np.random.default_rng(0).integers(5, 100, (2, 16)), jnp.int32)
  seg = jnp.zeros_like(ids)

  weights = jax.random.normal(jax.random.key(3), (2, 16, c.model.hidden_size))  # not a norm: LayerNorm fixes that

  def loss(model, p):
    return jnp.sum(model.apply({"params": p}, ids, seg, method=modeling.Electra.encode) * weights)

  (a, ga), (b, gb) = (jax.jit(jax.value_and_grad(functools.partial(loss, m)))(params) for m in (unrolled, scanned))
  np.testing.assert_allclose(a, b, rtol=1e-5)
  # Summed in another order inside the scan: equal to float32 rounding (attention's key bias has a zero gradient,
  # so only rounding is left of it: the tolerance is relative to the largest gradient).
  scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(ga))
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6 * scale), ga, gb)
  train = lambda model, key: jax.jit(lambda: model.apply(
      {"params": params}, ids, seg, deterministic=False, rngs={"dropout": key}, method=modeling.Electra.encode))()
  assert not np.allclose(train(scanned, jax.random.key(1)), train(scanned, jax.random.key(2)))
  # Each layer draws its dropout masks (attention's too) from the keys the network derives at once, scanned or not.
  assert unrolled.config.attention_dropout_rate > 0
  np.testing.assert_allclose(train(unrolled, jax.random.key(1)), train(scanned, jax.random.key(1)), rtol=1e-5)


def test_one_hot_embeddings_equal_the_gather():
  """model.one_hot_embeddings (the official code's TPU lookup): in float32 the very outputs and gradients of the
  gather, the word table's included (a matmul's instead of a scatter-add's); in bfloat16, where its rows are rounded
  before the position and type rows are added, as close to float32 as the gather."""
  gather = _attention_outputs("einsum")
  assert max(_max_diffs(_attention_outputs("einsum", one_hot_embeddings=True), gather)) < 1e-6
  gather_error = _max_diffs(_attention_outputs("einsum", "bfloat16"), gather)
  one_hot_error = _max_diffs(_attention_outputs("einsum", "bfloat16", one_hot_embeddings=True), gather)
  assert all(o <= 1.5 * g for o, g in zip(one_hot_error, gather_error)), (one_hot_error, gather_error)


def test_lookups_without_gathers_equal_the_gathers():
  """The token-type rows (select_rows) and the hidden states at the masked positions (gather_positions) equal
  jnp.take's and take_along_axis's, and so do their gradients."""
  rng = np.random.default_rng(0)
  table, x = (jnp.asarray(rng.standard_normal(shape), jnp.float32) for shape in ((2, 8), (3, 16, 8)))
  types = jnp.asarray(rng.integers(0, 2, (3, 16)), jnp.int32)
  positions = jnp.asarray(np.stack([rng.choice(16, 5, replace=False) for _ in range(3)]), jnp.int32)
  weights = jnp.asarray(rng.standard_normal((3, 16, 8)), jnp.float32)

  def check(new, old, arg):
    (a, ga), (b, gb) = (jax.value_and_grad(lambda t, f=f: jnp.sum(f(t) * weights[:, :f(t).shape[1]]))(arg)
                        for f in (new, old))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(ga, gb, rtol=1e-6)

  check(lambda t: modeling.select_rows(t, types), lambda t: jnp.take(t, types, axis=0), table)
  check(lambda h: modeling.gather_positions(h, positions),
        lambda h: jnp.take_along_axis(h, positions[..., None], axis=1), x)


def _softmax_attention(q, k, v, mask, rate, rng):
  """The plain attention modeling.attention stands for: autodiff through jax.nn.softmax (in float32, in bfloat16
  rounded where the einsum path rounded before modeling.attention), with Dropout's keep-masks."""
  scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
  scores = jnp.where(mask[:, None, None, :], scores, jnp.finfo(scores.dtype).min)
  probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(q.dtype)
  if rng is not None:
    threshold = round(rate * 2**16)
    keep = jax.random.bits(rng, probs.shape, jnp.uint16) >= threshold
    probs = jnp.where(keep, probs / ((2**16 - threshold) / 2**16), 0).astype(q.dtype)
  return jnp.einsum("bhqk,bkhd->bqhd", probs, v)


def _attention_and_grads(fn, shape, lengths, rng, dtype=jnp.float32):
  """fn's output and the gradients of q, k and v under a random cotangent; q and k peaked enough that the softmax is
  far from uniform, keys masked from `lengths` on per row (0: a row with no key at all)."""
  r = np.random.default_rng(0)
  q, k, v, grad = (jnp.asarray(r.standard_normal(shape) * scale, dtype) for scale in (2, 2, 1, 1))
  mask = jnp.arange(shape[1])[None] < jnp.asarray(lengths)[:, None]
  out, vjp = jax.vjp(lambda *x: fn(*x, mask, 0.1, rng), q, k, v)
  return [out, *vjp(grad)]


@pytest.mark.parametrize("dropout", [False, True])
def test_attention_equals_softmax_attention_in_float32(dropout):
  """modeling.attention (log-sum-exp forward, recomputing backward) against autodiff through jax.nn.softmax: the same
  outputs and q, k, v gradients to float32 rounding, with dropout (the same key, so the same masks) and without, over
  full rows, padded rows and a row with no key. A wrong scale, mask or dropout mask errs by far more than rtol."""
  rng = jax.random.key(1) if dropout else None
  lengths = [16, 5, 0, 11]
  new = jax.jit(lambda r: _attention_and_grads(modeling.attention, (4, 16, 3, 8), lengths, r))(rng)
  old = _attention_and_grads(_softmax_attention, (4, 16, 3, 8), lengths, rng)
  for a, b in zip(new, old):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=2e-6 * float(jnp.abs(b).max()))
  other = _attention_and_grads(_softmax_attention, (4, 16, 3, 8), lengths, jax.random.key(2) if dropout else None)
  assert dropout == (float(jnp.abs(new[0] - other[0]).max()) > 0.1)


def test_attention_in_bfloat16_is_as_close_to_float32_as_softmax_attention():
  """In bfloat16 neither path equals float32; modeling.attention's outputs and gradients are as close to it (RMS,
  relative) as the plain path's, to 10% (measured: at most 4% further, on the q and k gradients)."""
  args = (8, 64, 4, 32), np.random.default_rng(1).integers(1, 65, 8), jax.random.key(1)
  exact = _attention_and_grads(_softmax_attention, *args)

  def errors(fn):
    low = _attention_and_grads(fn, *args, dtype=jnp.bfloat16)
    return [float(jnp.sqrt(jnp.mean((a.astype(jnp.float32) - b) ** 2) / jnp.mean(b ** 2))) for a, b in zip(low, exact)]
  new, old = errors(modeling.attention), errors(_softmax_attention)
  assert all(0 < n <= 1.1 * o for n, o in zip(new, old)), (new, old)


class _FlaxDense(modeling.Dense):
  """modeling.Dense's parameters through nn.Dense's function (all three in `dtype`, then a plain matmul and the
  bias); with add_bias=False, its biased output and a zero bias (the reference adds nothing more)."""

  def __call__(self, x, add_bias=True):
    x, kernel, bias = flax.linen.dtypes.promote_dtype(x, *self.weights(x.shape[-1]), dtype=self.dtype)
    y = x @ kernel + bias
    return y if add_bias else (y, jnp.zeros(self.features))


class _FlaxLayerNorm(flax.linen.LayerNorm):
  """flax's nn.LayerNorm of x + h + h_bias, without dropout (keep is None in these deterministic passes)."""

  def __call__(self, x, h=None, h_bias=None, keep=None, rate=0.0):
    assert keep is None
    return super().__call__(x if h is None else x + h + h_bias)


def _flax_layers(monkeypatch):
  """The model with flax's own nn.Dense and nn.LayerNorm (same parameters) in place of modeling's Dense and
  LayerNorm: the reference their written-out matmuls and backward pass must equal (Q, K and V's `projections`,
  checked on its own below, stay)."""
  monkeypatch.setattr(modeling, "Dense", _FlaxDense)
  monkeypatch.setattr(modeling, "_layer_norm", lambda c, axis, name="LayerNorm": _FlaxLayerNorm(
      epsilon=c.layer_norm_eps, dtype=c.compute_dtype, name=name))


def test_layer_norm_of_a_residual_sum_with_dropout_is_autodiffs():
  """modeling.layer_norm of x + dropout(h + h_bias), the post-LN layer's add & norm with its own backward pass: in
  float32 the output and every input's gradient (the dropped positions' included) equal autodiff's of the plain
  composition, flax's LayerNorm included, to rounding; without h it is flax's LayerNorm of x."""
  rng = np.random.default_rng(0)
  x, h = (jnp.asarray(rng.normal(size=(4, 8, 32)), jnp.float32) for _ in range(2))
  scale, bias, h_bias = (jnp.asarray(rng.normal(size=32), jnp.float32) for _ in range(3))
  keep = jnp.asarray(rng.random((4, 8, 32)) > 0.25)
  cotangent = jnp.asarray(rng.normal(size=(4, 8, 32)), jnp.float32)
  ln = flax.linen.LayerNorm(epsilon=1e-12)

  def reference(x, scale, bias, h, h_bias):
    s = x if h is None else x + jnp.where(keep, (h + h_bias) / 0.75, 0)  # inverted dropout at rate 0.25
    return ln.apply({"params": {"scale": scale, "bias": bias}}, s)

  for args in ((x, scale, bias, h, h_bias), (x, scale, bias, None, None)):
    ours, ours_grad = jax.vjp(lambda *a: modeling.layer_norm(*a, None if a[3] is None else keep, 1e-12, 0.25), *args)
    theirs, theirs_grad = jax.vjp(reference, *args)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    for a, b in zip(jax.tree.leaves(ours_grad(cotangent)), jax.tree.leaves(theirs_grad(cotangent)), strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * float(jnp.abs(b).max()))


@pytest.mark.parametrize("shape", [(16, 512, 8), (4, 8, 3), (1, 8192, 2)])
def test_sums_in_parts_are_column_sums(shape):
  """modeling.sums_in_parts, the GPU's bias gradients (partial sums of at most 4,096 rows, added up; the CPU sums
  plainly, so only this test runs it here): the sums over every axis but the last, for one part, several, and a
  batch too short to split (one part of 8,192 rows)."""
  rng = np.random.default_rng(0)
  arrays = [jnp.asarray(rng.normal(size=shape), dtype) for dtype in (jnp.float32, jnp.bfloat16)]
  for ours, array in zip(modeling.sums_in_parts(*arrays), arrays, strict=True):
    assert ours.dtype == jnp.float32 and ours.shape == shape[-1:]
    np.testing.assert_allclose(ours, np.asarray(array, np.float64).sum((0, 1)), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("weight_axis", [0, 1])
def test_weight_gradients_in_parts_are_autodiffs(weight_axis):
  """modeling.matmul's weight gradient as the GPU computes it (parts of the rows multiplied side by side, then added;
  the CPU takes one part, so only this test runs several here): autodiff's gradient of the plain matmul, for one
  part and for every part count the rule picks at ELECTRA-Small's shapes (8 for a 256 × 1,024 weight, 32 for
  256 × 256; one for a 64 × 64 weight, which XLA splits itself)."""
  rng = np.random.default_rng(0)
  x, grad = (jnp.asarray(rng.normal(size=(128, 128, n)), jnp.bfloat16) for n in (256, 1024))
  weight = jnp.zeros((256, 1024) if weight_axis == 0 else (1024, 256), jnp.float32)
  exact = jax.vjp(lambda w: jnp.einsum("bli,io->blo" if weight_axis == 0 else "bli,oi->blo", x, w,
                                        preferred_element_type=jnp.float32), weight)[1](grad.astype(jnp.float32))[0]
  assert [modeling.gradient_parts(x, n) for n in (256 * 1024, 256 * 256, 64 * 64)] == [8, 32, 1]
  for parts in (1, 8, 32):
    ours = modeling.weight_gradient(x, grad, weight_axis, parts)
    assert ours.dtype == jnp.float32 and ours.shape == weight.shape
    np.testing.assert_allclose(ours, exact, rtol=1e-4, atol=1e-4 * float(jnp.abs(exact).max()))


def test_keep_masks_drawn_flat_are_the_shaped_draws():
  """modeling.keep_mask's flat draw (one run of bits, reshaped: on a GPU without the per-axis counters' kernels)
  is the shaped draw bit for bit, so a run's dropout does not depend on which one a device count picks."""
  key = jax.random.PRNGKey(7)
  for shape in ((2, 4, 16, 32), (3, 5, 7)):
    flat, shaped = (modeling.keep_mask(key, shape, 0.1, flat=f) for f in (True, False))
    assert flat.shape == shaped.shape == shape and bool((flat == shaped).all()) and 0.8 < float(flat.mean()) < 1


def test_projections_are_separate_dense_layers():
  """modeling.projections (Q, K and V's kernels side by side, its own backward pass) equals three flax nn.Dense
  layers in float32, outputs and the gradients of the input, every kernel and every bias."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(4, 8, 16)), jnp.float32)
  kernels = tuple(jnp.asarray(rng.normal(size=(16, n)), jnp.float32) for n in (16, 16, 16))
  biases = tuple(jnp.asarray(rng.normal(size=n), jnp.float32) for n in (16, 16, 16))
  cotangents = tuple(jnp.asarray(rng.normal(size=(4, 8, n)), jnp.float32) for n in (16, 16, 16))

  def separate(x, kernels, biases):
    return tuple(flax.linen.Dense(k.shape[1]).apply({"params": {"kernel": k, "bias": b}}, x)
                 for k, b in zip(kernels, biases))

  ours, ours_vjp = jax.vjp(modeling.projections, x, kernels, biases)
  theirs, theirs_vjp = jax.vjp(separate, x, kernels, biases)
  for a, b in zip(jax.tree.leaves((ours, ours_vjp(cotangents))), jax.tree.leaves((theirs, theirs_vjp(cotangents))),
                  strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(jnp.abs(b).max()))


def test_dense_and_layer_norm_are_flaxs(monkeypatch):
  """modeling.Dense (the weight rounded inside the matmul) and modeling.layer_norm (its own backward pass) compute
  flax's nn.Dense and nn.LayerNorm: in float32 the same outputs and gradients to rounding; in bfloat16 as close to
  float32 as flax's layers are, to a quarter (the largest error is one rounded value: measured 15% more on the
  discriminator's logits, 17% less on the generator's, the same on the gradients)."""
  ours, ours_bf16 = _attention_outputs("einsum"), _attention_outputs("einsum", "bfloat16")
  _flax_layers(monkeypatch)
  flax_f32, flax_bf16 = _attention_outputs("einsum"), _attention_outputs("einsum", "bfloat16")
  assert jax.tree.structure(ours) == jax.tree.structure(flax_f32)
  scale = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(flax_f32[2]))
  assert max(_max_diffs(ours, flax_f32)[:2]) < 1e-5 and _max_diffs(ours, flax_f32)[2] < 1e-5 * scale
  ours_error, flax_error = _max_diffs(ours_bf16, flax_f32), _max_diffs(flax_bf16, flax_f32)
  assert all(o <= 1.25 * f for o, f in zip(ours_error, flax_error)), (ours_error, flax_error)

