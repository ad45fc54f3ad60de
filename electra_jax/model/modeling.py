"""ELECTRA's networks as Flax Linen modules: `Electra` owns every parameter of a run, one method per forward pass
(objectives.py composes them), named as HF transformers' ELECTRA, so export is a rename-free transpose. Several
functions are written for fewer kernels on a GPU (docs/benchmarks.md, "Kernels of Small's step")."""
import dataclasses
import functools
import math
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from electra_jax.model import sampling

SHARING_MODES = ("shared", "untied", "all", "gdes")
ATTENTION_IMPLS = ("einsum", "fused")
DTYPES = ("float32", "bfloat16", "float16")  # model.dtype: the compute dtype (parameters stay float32)
# One-hot matmuls that stand for lookups: float32 ones must not round to bfloat16, as TPUs' default precision does.
EXACT = jax.lax.Precision.HIGHEST


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
  """The sizes of one Transformer encoder (the discriminator's, or the generator's scaled copy)."""
  num_layers: int
  hidden_size: int
  num_heads: int
  intermediate_size: int


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  vocab_size: int
  embedding_size: int
  discriminator: EncoderConfig
  generator: EncoderConfig
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  initializer_range: float = 0.02
  layer_norm_eps: float = 1e-12
  dtype: str = "float32"
  remat: bool = False
  embedding_sharing: str = "shared"
  attention_impl: str = "einsum"
  scan_layers: bool = False
  one_hot_embeddings: bool = False

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> "ModelConfig":
    m = config.model
    if config.objective.embedding_sharing not in SHARING_MODES:
      raise ValueError(f"objective.embedding_sharing={config.objective.embedding_sharing!r}: "
                       f"expected one of {', '.join(SHARING_MODES)}")
    if config.objective.embedding_sharing == "all" and m.generator_fraction != 1.0:
      raise ValueError("objective.embedding_sharing=all ties every weight, so it needs "
                       f"model.generator_fraction=1.0 (got {m.generator_fraction})")
    if m.hidden_size % m.num_heads:
      raise ValueError(f"model.hidden_size={m.hidden_size} is not divisible by model.num_heads={m.num_heads}")
    if config.data.seq_len > m.max_position_embeddings:
      raise ValueError(f"data.seq_len={config.data.seq_len} exceeds the position table "
                       f"(model.max_position_embeddings={m.max_position_embeddings})")
    if m.dtype not in DTYPES:
      raise ValueError(f"model.dtype={m.dtype!r}: expected one of {', '.join(DTYPES)}")
    if m.attention_impl not in ATTENTION_IMPLS:
      raise ValueError(f"model.attention_impl={m.attention_impl!r}: expected one of {', '.join(ATTENTION_IMPLS)}")
    if m.attention_impl == "fused" and m.attention_dropout_rate > 0:
      raise ValueError("model.attention_impl='fused' cannot drop attention probabilities (jax.nn.dot_product_attention "
                       f"has no dropout): set model.attention_dropout_rate=0 (got {m.attention_dropout_rate}) "
                       "or use model.attention_impl=einsum")
    disc = EncoderConfig(m.num_layers, m.hidden_size, m.num_heads, m.intermediate_size)
    f = m.generator_fraction
    gen = EncoderConfig(m.num_layers, max(1, round(m.hidden_size * f)), max(1, round(m.num_heads * f)),
                        max(1, round(m.intermediate_size * f)))
    same = {k.name: m[k.name] for k in dataclasses.fields(cls) if k.name in m}  # fields named as config.model's keys
    return cls(vocab_size=config.data.vocab_size, discriminator=disc, generator=gen,
               embedding_sharing=config.objective.embedding_sharing, **same)

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)


def _init(config: ModelConfig, axes):
  """A truncated-normal(σ=initializer_range) init annotated with logical axis names (sharding.py maps them)."""
  return nn.with_logical_partitioning(nn.initializers.normal(config.initializer_range), axes)


# Dot algorithms that round both operands to a 16-bit compute dtype inside the matmul and add in float32.
_ALGORITHMS = {jnp.dtype(jnp.bfloat16): jax.lax.DotAlgorithmPreset.BF16_BF16_F32,
               jnp.dtype(jnp.float16): jax.lax.DotAlgorithmPreset.F16_F16_F32}


# The most rows XLA:GPU sums a column of in one kernel (32 threads of 128 rows each); it sums a longer one in two.
_ROWS_PER_KERNEL = 4096


def sums_in_parts(*arrays) -> tuple:
  """Each array of one shape summed over every axis but the last, in float32, as one reduction to k partial sums of
  at most _ROWS_PER_KERNEL rows, added elementwise where XLA fuses them into the sums' consumer. k divides the batch
  axis; on a mesh of several devices k is 1 (parts split over devices would be gathered to be added)."""
  batch, rows = arrays[0].shape[0], arrays[0].size // arrays[0].shape[-1]
  k = 1 if jax.sharding.get_abstract_mesh().size > 1 else next(
      (d for d in range(-(-rows // _ROWS_PER_KERNEL), batch + 1) if batch % d == 0), batch)
  parts = jax.lax.reduce(tuple(a.astype(jnp.float32).reshape(k, rows // k, a.shape[-1]) for a in arrays),
                         (jnp.float32(0),) * len(arrays), lambda u, v: tuple(p + q for p, q in zip(u, v)), (1,))
  return tuple(functools.reduce(jnp.add, list(p)) for p in parts)


def column_sums(*arrays) -> tuple:
  """Each array summed over all but its last axis in float32 (a bias's gradient): sums_in_parts, except on CPUs, where
  XLA runs a variadic reduction slower than separate sums."""
  return jax.lax.platform_dependent(
      *arrays, cpu=lambda *a: tuple(t.astype(jnp.float32).sum(tuple(range(t.ndim - 1))) for t in a),
      default=sums_in_parts)


def _matmul(x, weight, dtype, weight_axis):
  if x.shape[-1] == 1:  # an outer product (dense_prediction's input gradient) elementwise, fused with its neighbours
    w = jnp.moveaxis(weight, weight_axis, 0).astype(dtype).astype(jnp.float32)
    return (x.astype(dtype).astype(jnp.float32) * w[0]).astype(dtype)
  dims = (((x.ndim - 1,), (weight_axis,)), ((), ()))
  return jax.lax.dot_general(x.astype(dtype), weight, dims, precision=_ALGORITHMS.get(jnp.dtype(dtype)),
                             preferred_element_type=dtype)


def weight_gradient(x, grad, weight_axis: int, parts: int):
  """Σ over rows of xᵀ · grad in float32, laid out as the weight ([in, out]; [out, in] for weight_axis 1): one
  matmul of `parts` slices of the rows side by side, its results added elementwise."""
  x, grad = (t.reshape(parts, -1, t.shape[-1]) for t in (x, grad))
  a, b = (x, grad) if weight_axis == 0 else (grad, x)
  products = jax.lax.dot_general(a, b, (((1,), (1,)), ((0,), (0,))), preferred_element_type=jnp.float32)
  return functools.reduce(jnp.add, list(products))


def gradient_parts(x: jax.Array, weight_size: int) -> int:
  """XLA:GPU splits a weight gradient's long sum over rows into parts (split-K) and adds them up in a kernel of its
  own; the same split made here is added elementwise where XLA fuses it into the update's concatenation. Parts of
  whole sequences, of at most as many rows as XLA's own (the weight's size / 128 rounded down to a power of two, at
  least 256), so it splits none further. One part (XLA's split) for weights under 64K numbers, whose 32 or more
  parts' additions XLA would no longer fuse, and on a mesh of several devices (parts split over them would be
  gathered)."""
  if weight_size < 2**16 or jax.sharding.get_abstract_mesh().size > 1:
    return 1
  batch, rows = x.shape[0], x.size // x.shape[-1]
  most_rows = max(256, 1 << ((weight_size // 128).bit_length() - 1))
  return next((d for d in range(1, batch + 1) if batch % d == 0 and rows // d <= most_rows), batch)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def matmul(x: jax.Array, weight: jax.Array, dtype, weight_axis: int = 0) -> jax.Array:
  """x's last axis times `weight`'s axis `weight_axis`, in `dtype`: a float32 weight is rounded to 16 bits inside the
  matmul (a dot algorithm), not by a cast that both passes would share, a GPU kernel per weight and step. The
  weight's gradient is float32, on a GPU summed from parts of the rows (gradient_parts)."""
  return _matmul(x, weight, dtype, weight_axis)


def _matmul_bwd(dtype, weight_axis, residuals, grad):
  x, weight = residuals
  dweight = jax.lax.platform_dependent(
      x.astype(dtype), grad, cuda=lambda x, g: weight_gradient(x, g, weight_axis, gradient_parts(x, weight.size)),
      default=lambda x, g: weight_gradient(x, g, weight_axis, 1))
  return _matmul(grad, weight, dtype, 1 - weight_axis).astype(x.dtype), dweight.astype(weight.dtype)


matmul.defvjp(lambda x, weight, dtype, weight_axis: (_matmul(x, weight, dtype, weight_axis), (x, weight)),
              _matmul_bwd)


class Dense(nn.Module):
  """nn.Dense (same parameters, same math) whose kernel goes to `matmul` as it is stored."""
  features: int
  dtype: jnp.dtype
  kernel_init: nn.initializers.Initializer
  bias_init: nn.initializers.Initializer

  @nn.compact
  def weights(self, in_features: int):
    """The kernel [in_features, features] and the bias [features], float32."""
    return (self.param("kernel", self.kernel_init, (in_features, self.features), jnp.float32),
            self.param("bias", self.bias_init, (self.features,), jnp.float32))

  def __call__(self, x, add_bias: bool = True):
    """x · kernel + bias; with add_bias=False, x · kernel and the bias apart (for `layer_norm` to add)."""
    kernel, bias = self.weights(x.shape[-1])
    y = matmul(x, kernel, self.dtype)
    # The bias added in float32 and the sum rounded once: a rounded bias shared by both passes is a GPU kernel.
    return (y + bias).astype(self.dtype) if add_bias else (y, bias)


def dense(config: ModelConfig, features: int, axes, name: str) -> Dense:
  return Dense(features, config.compute_dtype, _init(config, axes),
               nn.with_logical_partitioning(nn.initializers.zeros, axes[-1:]), name=name)


def keep_mask(rng: jax.Array, shape, rate: float, flat: bool = False) -> jax.Array:
  """Dropout's keep-mask for `shape`, drawn as 16-bit integers (the rate exact to 1/65536). `flat`: drawn as one run
  and reshaped (the same bits), where XLA:GPU would compute the draw's per-axis counters in kernels of their own (a
  mask of hidden states; attention's is drawn inside the softmax's kernel); shaped on a mesh all the same, so that
  its batch axis splits the draw over the devices."""
  drawn = (math.prod(shape),) if flat and jax.sharding.get_abstract_mesh().size == 1 else shape
  return jax.random.bits(rng, drawn, jnp.uint16).reshape(shape) >= round(rate * 2**16)


def _kept(x: jax.Array, keep: jax.Array, rate: float) -> jax.Array:
  """x where `keep`, scaled up by what is kept on average (inverted dropout), else 0."""
  return jnp.where(keep, x / ((2**16 - round(rate * 2**16)) / 2**16), 0).astype(x.dtype)


def _dropped(x: jax.Array, rate: float, rng: Optional[jax.Array], flat: bool = False) -> jax.Array:
  """Inverted dropout with `rng`'s keep-mask (None: none); `flat`: keep_mask's."""
  return x if rng is None else _kept(x, keep_mask(rng, x.shape, rate, flat), rate)


class Dropout(nn.Module):
  """Inverted dropout with 16-bit keep-masks (keep_mask): half the random bits of nn.Dropout's 32-bit uniforms."""
  rate: float

  @nn.compact
  def __call__(self, x, deterministic: bool):
    return _dropped(x, self.rate, None if deterministic or self.rate == 0.0 else self.make_rng("dropout"), flat=True)


def _normalized(x: jax.Array, eps: float):
  """(x - mean) · rstd over the last axis in float32, and rstd = 1 / √(var + eps), var the mean of (x - mean)²."""
  x = x.astype(jnp.float32)
  centered = x - x.mean(-1, keepdims=True)
  rstd = jax.lax.rsqrt((centered * centered).mean(-1, keepdims=True) + eps)
  return centered * rstd, rstd


def _project(x, kernels, biases):
  joined = matmul(x, jnp.concatenate(kernels, 1), x.dtype) + jnp.concatenate(biases)
  return tuple(y.astype(x.dtype) for y in jnp.split(joined, len(kernels), -1))


@jax.custom_vjp
def projections(x: jax.Array, kernels: tuple, biases: tuple) -> tuple:
  """x · kernel + bias for Q, K and V's kernels and biases, in float32 rounded to x's dtype, as one matmul of the
  kernels side by side; the backward pass is separate layers', the biases' gradients summed in one reduction."""
  return _project(x, kernels, biases)


def _projections_bwd(residuals, grads):
  x, kernels = residuals
  dx, dkernels = jax.vjp(lambda x, ks: tuple(matmul(x, k, x.dtype) for k in ks), x, kernels)[1](grads)
  sums, = column_sums(jnp.concatenate(grads, -1))
  return dx, dkernels, tuple(jnp.split(sums, len(grads)))


projections.defvjp(lambda x, kernels, biases: (_project(x, kernels, biases), (x, kernels)), _projections_bwd)


def _sum(x, h, h_bias, keep, rate):
  """x + dropout(h + h_bias) in float32 (x alone when h is None; no dropout when keep is None)."""
  s = x.astype(jnp.float32)
  if h is None:
    return s
  h = h.astype(jnp.float32) + h_bias
  return s + (h if keep is None else _kept(h, keep, rate))


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
def layer_norm(x, scale, bias, h, h_bias, keep, eps: float, rate: float):
  """nn.LayerNorm over the last axis of x + dropout(h + h_bias) (a post-LN layer's add & norm; x alone when h is
  None), statistics in float32, the result in x's dtype. Both passes keep only their inputs and recompute the sum
  and its statistics: the forward pass is one GPU kernel, the backward one row-wise kernel and one reduction."""
  return _layer_norm_fwd(x, scale, bias, h, h_bias, keep, eps, rate)[0]


def _layer_norm_fwd(x, scale, bias, h, h_bias, keep, eps, rate):
  x_hat, _ = _normalized(_sum(x, h, h_bias, keep, rate), eps)
  # The barrier keeps XLA from handing the next layer the float32 result beside the rounded one (a second kernel).
  return jax.lax.optimization_barrier((x_hat * scale + bias).astype(x.dtype)), (x, scale, h, h_bias, keep)


def _layer_norm_bwd(eps, rate, residuals, grad):
  x, scale, h, h_bias, keep = residuals
  # The barrier keeps XLA from sharing (CSE) the recomputed sum and statistics with the forward pass's kernel.
  x, h, keep = jax.lax.optimization_barrier((x, h, keep))
  x_hat, rstd = _normalized(_sum(x, h, h_bias, keep, rate), eps)
  grad = grad.astype(jnp.float32)
  g = grad * scale
  # d/dx of (x - mean) · rstd: g's part minus its mean and its projection on x_hat, times rstd.
  dx = rstd * (g - g.mean(-1, keepdims=True) - x_hat * (g * x_hat).mean(-1, keepdims=True))
  dx = jax.lax.optimization_barrier(dx.astype(x.dtype))  # rounded once, for both its uses (as in the forward pass)
  dh = None if h is None else (dx if keep is None else _kept(dx, keep, rate)).astype(h.dtype)
  sums = column_sums(grad * x_hat, grad) if h is None else column_sums(grad * x_hat, grad, dh)
  dscale, dbias, dh_bias = (*sums, None) if h is None else sums
  return dx, dscale, dbias, dh, dh_bias, None


layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


class LayerNorm(nn.Module):
  """nn.LayerNorm's parameters (float32) with `layer_norm`'s function, in `dtype`; `keep`: dropout's keep-mask."""
  epsilon: float
  dtype: jnp.dtype
  axis_name: str

  @nn.compact
  def __call__(self, x, h=None, h_bias=None, keep=None, rate: float = 0.0):
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, (self.axis_name,)),
                       (x.shape[-1],), jnp.float32)
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, (self.axis_name,)),
                      (x.shape[-1],), jnp.float32)
    return layer_norm(x.astype(self.dtype), scale, bias, h, h_bias, keep, self.epsilon, rate)


def _layer_norm(config: ModelConfig, axis_name: str, name: str = "LayerNorm") -> LayerNorm:
  return LayerNorm(config.layer_norm_eps, config.compute_dtype, axis_name, name=name)


def one_hot_lookup(table: jax.Array, ids: jax.Array, dtype) -> jax.Array:
  """table[ids] as a matmul of one-hot rows in `dtype` (its gradient a matmul, not a scatter-add): the official
  code's TPU lookup (use_one_hot_embeddings; costlier there: docs/tpu.md). Exact in float32, rounded in bfloat16."""
  one_hot = jax.nn.one_hot(ids, table.shape[0], dtype=dtype)
  return jnp.einsum("...v,ve->...e", one_hot, table.astype(dtype), precision=EXACT, preferred_element_type=jnp.float32)


def select_rows(table: jax.Array, ids: jax.Array) -> jax.Array:
  """table[ids] for a few-row table (token types) as one select a row: no scatter-add in its gradient (docs/tpu.md)."""
  return sum(jnp.where((ids == t)[..., None], table[t], 0.0) for t in range(table.shape[0]))


class Embeddings(nn.Module):
  """word + position + token-type embeddings → LayerNorm → dropout, at the embedding size. With `gdes_base`
  (DeBERTa-v3's gradient-disentangled sharing) the word table is stop_gradient(base) + a zero-initialised delta."""
  config: ModelConfig
  gdes_delta: bool = False

  def setup(self):
    c = self.config
    table_init = nn.initializers.zeros if self.gdes_delta else nn.initializers.normal(c.initializer_range)
    self.word_embeddings = self.param(
        "word_embeddings_delta" if self.gdes_delta else "word_embeddings",
        nn.with_logical_partitioning(table_init, ("vocab", "embed")), (c.vocab_size, c.embedding_size))
    self.position_embeddings = self.param(
        "position_embeddings", _init(c, (None, "embed")), (c.max_position_embeddings, c.embedding_size))
    self.token_type_embeddings = self.param(
        "token_type_embeddings", _init(c, (None, "embed")), (c.type_vocab_size, c.embedding_size))
    self.layer_norm = _layer_norm(c, "embed")

  def table(self, gdes_base: Optional[jax.Array] = None) -> jax.Array:
    return self.word_embeddings if gdes_base is None else jax.lax.stop_gradient(gdes_base) + self.word_embeddings

  def __call__(self, input_ids, segment_ids, *, dropout_key: Optional[jax.Array] = None,
               gdes_base: Optional[jax.Array] = None):
    """`dropout_key`: the key of the output's dropout mask (None: no dropout)."""
    c = self.config
    dtype = c.compute_dtype
    table = self.table(gdes_base)
    x = one_hot_lookup(table, input_ids, dtype) if c.one_hot_embeddings else jnp.take(table, input_ids, axis=0)
    x += self.position_embeddings[None, :input_ids.shape[1]]
    x += select_rows(self.token_type_embeddings, segment_ids)
    x = self.layer_norm(x.astype(dtype))
    x = nn.with_logical_constraint(x, ("batch", "length", "act_embed"))
    return _dropped(x, c.dropout_rate, dropout_key, flat=True)


def fused_kernel(dtype) -> str | None:
  """The fused implementation: "cudnn" on an NVIDIA GPU (the traced mesh's, else this host's) in 16 bits, else None."""
  device = jax.sharding.get_abstract_mesh().abstract_device or jax.devices()[0]
  nvidia = device.platform == "gpu" and "NVIDIA" in device.device_kind
  return "cudnn" if nvidia and jnp.dtype(dtype).itemsize == 2 else None


def _masked_scores(q, k, mask):
  """q kᵀ / √head_dim [batch, heads, query, key] (q, k: [batch, heads, length, head_dim]) in q's dtype, with the
  dtype's lowest value where a key is masked and 0 everywhere in a row with no key at all (the uniform softmax that
  the lowest value alone would give it)."""
  scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
  lowest = jnp.finfo(scores.dtype).min
  fill = jnp.where(mask.any(-1), lowest, 0).astype(scores.dtype)[:, None, None, None]
  return jnp.where(mask[:, None, None, :], scores, fill)


def _logsumexp(scores: jax.Array) -> jax.Array:
  """log Σ exp(scores) over the last axis in float32, from the row's max (one pass in log space crashes libtpu)."""
  s = scores.astype(jnp.float32)
  top = s.max(-1, keepdims=True)
  return top + jnp.log(jnp.exp(s - top).sum(-1, keepdims=True))


def _probabilities(scores: jax.Array, lse: jax.Array) -> jax.Array:
  """softmax(scores) in float32: exp(scores - lse), which a TPU fuses into the PV matmul's operand; on a GPU the
  exponentials from the row's max over their sum, XLA's softmax pattern, which it fuses into one kernel."""
  def normalised(s, _):
    e = jnp.exp(s.astype(jnp.float32) - s.max(-1, keepdims=True).astype(jnp.float32))
    return e / e.sum(-1, keepdims=True)
  return jax.lax.platform_dependent(scores, lse, cuda=normalised,
                                    default=lambda s, lse: jnp.exp(s.astype(jnp.float32) - lse))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def attention(q, k, v, mask, dropout_rate: float = 0.0, rng: Optional[jax.Array] = None) -> jax.Array:
  """softmax(q kᵀ / √head_dim over the keys where `mask`) with dropout (keep-masks from `rng`; None: none), times v.
  q, k, v: [batch, length, heads, head_dim], multiplied head-major; mask: [batch, key]. The backward pass recomputes
  the scores and masks from q, k, v, the output and the rows' log-sum-exp (flash attention's recompute, in XLA ops:
  docs/tpu.md; on a GPU the softmax from the scores: `_probabilities`)."""
  return _attention_fwd(q, k, v, mask, dropout_rate, rng)[0]


def _heads(x: jax.Array) -> jax.Array:
  """[batch, length, heads, head_dim] <-> [batch, heads, length, head_dim]: the matmuls' batch axes leading."""
  return x.transpose(0, 2, 1, 3)


def _attention_fwd(q, k, v, mask, dropout_rate, rng):
  q, k, v = map(_heads, (q, k, v))
  scores = _masked_scores(q, k, mask)
  lse = _logsumexp(scores)
  probs = _dropped(_probabilities(scores, lse), dropout_rate, rng)
  out = jnp.einsum("bhqk,bhkd->bhqd", probs.astype(v.dtype), v)
  return _heads(out), (q, k, v, mask, rng, out, lse)


def _attention_bwd(dropout_rate, residuals, grad):
  q, k, v, mask, rng, out, lse = residuals
  grad = _heads(grad)
  probs = _probabilities(_masked_scores(q, k, mask), lse)
  dv = jnp.einsum("bhqk,bhqd->bhkd", _dropped(probs, dropout_rate, rng).astype(v.dtype), grad)
  dprobs = _dropped(jnp.einsum("bhqd,bhkd->bhqk", grad, v, preferred_element_type=jnp.float32), dropout_rate, rng)
  # Softmax's backward subtracts Σ_key probs · dprobs, which is also grad · out, a product over head_dim: a TPU
  # takes that (the sum over the keys cost it more: docs/tpu.md); on a GPU XLA fuses the sum over the keys with the
  # recomputed softmax into one kernel.
  total = jax.lax.platform_dependent(
      probs, dprobs, grad, out, cuda=lambda p, dp, g, o: (p * dp).sum(-1, keepdims=True),
      default=lambda p, dp, g, o: (g.astype(jnp.float32) * o.astype(jnp.float32)).sum(-1, keepdims=True))
  dscores = jnp.where(mask[:, None, None, :], probs * (dprobs - total), 0) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
  dscores = dscores.astype(q.dtype)
  dq, dk = jnp.einsum("bhqk,bhkd->bhqd", dscores, k), jnp.einsum("bhqk,bhqd->bhkd", dscores, q)
  return (*map(_heads, (dq, dk, dv)), None, None)


attention.defvjp(_attention_fwd, _attention_bwd)


class SelfAttention(nn.Module):
  """Multi-head self-attention with a padding mask, Q, K, V separate layers as HF's: "einsum" `attention`, or "fused"
  jax.nn.dot_product_attention (no dropout). Returns the output layer's product and its bias apart (for layer_norm)."""
  config: ModelConfig
  encoder: EncoderConfig

  @nn.compact
  def __call__(self, x, mask, rng: Optional[jax.Array] = None):
    """`rng`: the key of attention dropout's masks (None: no attention dropout)."""
    c, e = self.config, self.encoder
    head_dim = e.hidden_size // e.num_heads
    split = lambda t: t.reshape(t.shape[:2] + (e.num_heads, head_dim))
    kernels, biases = zip(*(dense(c, e.hidden_size, ("hidden", "qkv"), name).weights(x.shape[-1])
                            for name in ("query", "key", "value")))
    q, k, v = map(split, projections(x.astype(c.compute_dtype), kernels, biases))
    # Fine-tuning may set attention dropout on a fused config: its dropout steps take the einsum path (same weights).
    if c.attention_impl == "fused" and rng is None:
      ctx = jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=mask.sum(-1, dtype=jnp.int32),
                                         scale=head_dim ** -0.5, implementation=fused_kernel(c.compute_dtype))
    else:
      ctx = attention(q, k, v, mask, c.attention_dropout_rate, rng)
    ctx = ctx.reshape(x.shape[:2] + (e.hidden_size,))
    return dense(c, e.hidden_size, ("qkv", "hidden"), "output")(ctx, add_bias=False)


class EncoderLayer(nn.Module):
  """One post-LayerNorm BERT layer: attention → add & norm → GELU FFN → add & norm."""
  config: ModelConfig
  encoder: EncoderConfig

  @nn.compact
  def __call__(self, x, mask, keys: Optional[jax.Array] = None):
    """`keys`: the layer's two dropout keys (None: no dropout), the hidden states' (both sites' masks drawn at once)
    and attention's; each unused where its rate is 0."""
    c, e = self.config, self.encoder
    hidden, attention_key = [None] * 2 if keys is None else keys
    keep = [None] * 2 if hidden is None or c.dropout_rate == 0.0 else keep_mask(
        hidden, (2,) + x.shape, c.dropout_rate, flat=True)
    h, bias = SelfAttention(c, e, name="attention")(x, mask, None if c.attention_dropout_rate == 0.0 else attention_key)
    x = _layer_norm(c, "hidden", "attention_LayerNorm")(x, h, bias, keep[0], c.dropout_rate)
    h = nn.gelu(dense(c, e.intermediate_size, ("hidden", "mlp"), "intermediate")(x), approximate=False)
    h, bias = dense(c, e.hidden_size, ("mlp", "hidden"), "output")(h, add_bias=False)
    x = _layer_norm(c, "hidden", "output_LayerNorm")(x, h, bias, keep[1], c.dropout_rate)
    return nn.with_logical_constraint(x, ("batch", "length", "act_hidden"))


class Encoder(nn.Module):
  """embeddings_project (when embedding size ≠ hidden size) and the stack of layers of one network."""
  config: ModelConfig
  encoder: EncoderConfig

  @nn.compact
  def __call__(self, embedded, mask, keys: Optional[jax.Array] = None):
    """`keys`: [layers, 2] dropout keys (EncoderLayer's; None: no dropout)."""
    c, e = self.config, self.encoder
    x = embedded
    if c.embedding_size != e.hidden_size:
      x = dense(c, e.hidden_size, ("embed", "hidden"), "embeddings_project")(x)
    if c.scan_layers and not self.is_initializing():
      return _scan_layers(c, e, self.variables["params"], x, mask, keys)
    layer_cls = nn.remat(EncoderLayer) if c.remat else EncoderLayer
    for i in range(e.num_layers):
      x = layer_cls(c, e, name=f"layer_{i}")(x, mask, None if keys is None else keys[i])
    return x


def _scan_layers(c: ModelConfig, e: EncoderConfig, params, x, mask, keys):
  """The layers as one lax.scan over their stacked parameters and `keys` (one layer compiled; names stay layer_i)."""
  stacked = jax.tree.map(lambda *p: jnp.stack(p), *(params[f"layer_{i}"] for i in range(e.num_layers)))
  layer = EncoderLayer(c, e)

  def body(h, inputs):
    p, k = inputs
    return layer.apply({"params": p}, h, mask, k), None

  x, _ = jax.lax.scan(jax.checkpoint(body) if c.remat else body, x, (stacked, keys))
  return x


class MaskedLMHead(nn.Module):
  """dense(embedding size) → GELU → LayerNorm → tied word table + bias (HF's generator_predictions, _lm_head)."""
  config: ModelConfig

  @nn.compact
  def __call__(self, h, table):
    c = self.config
    h = nn.gelu(dense(c, c.embedding_size, ("hidden", "embed"), "dense")(h), approximate=False)
    h = _layer_norm(c, "embed")(h)
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)), (c.vocab_size,))
    logits = matmul(h, table, h.dtype, weight_axis=1)
    return logits.astype(jnp.float32) + bias


class DiscriminatorHead(nn.Module):
  """dense(hidden) → GELU → dense(1): one "was this token replaced?" logit per position."""
  config: ModelConfig
  hidden_size: int

  @nn.compact
  def __call__(self, h):
    c = self.config
    h = nn.gelu(dense(c, self.hidden_size, ("hidden", "mlp"), "dense")(h), approximate=False)
    return dense(c, 1, ("mlp", None), "dense_prediction")(h)[..., 0].astype(jnp.float32)


def gather_positions(x: jax.Array, positions: jax.Array) -> jax.Array:
  """x[b, positions[b, p]] ([B, L, ...], [B, P]) as an exact one-hot matmul: its gradient a matmul, not a scatter."""
  return jnp.einsum("bpl,bl...->bp...", jax.nn.one_hot(positions, x.shape[1], dtype=x.dtype), x, precision=EXACT)


class Electra(nn.Module):
  """Every parameter of an ELECTRA run, with one method per forward pass; the tree per objective.embedding_sharing is
  docs/pretraining_features.md's ("Embedding sharing"). Init creates only what the methods it runs use (objectives.py
  picks them per objective), so objective=mlm carries no generator."""
  config: ModelConfig

  def setup(self):
    c = self.config
    if c.embedding_sharing in ("shared", "all"):
      self.embeddings = Embeddings(c)
    else:
      self.generator_embeddings = Embeddings(c)
      self.discriminator_embeddings = Embeddings(c, gdes_delta=c.embedding_sharing == "gdes")
    self.discriminator = Encoder(c, c.discriminator)
    if c.embedding_sharing != "all":
      self.generator = Encoder(c, c.generator)
    self.generator_head = MaskedLMHead(c)
    self.discriminator_head = DiscriminatorHead(c, c.discriminator.hidden_size)
    self.discriminator_mlm_head = MaskedLMHead(c)

  def _encode(self, net: str, input_ids, segment_ids, deterministic: bool):
    """Final hidden states of network `net` and the word table its tied output layer uses."""
    c = self.config
    if c.embedding_sharing in ("shared", "all"):
      emb, base = self.embeddings, None
    elif net == "generator":
      emb, base = self.generator_embeddings, None
    else:
      emb = self.discriminator_embeddings
      base = self.generator_embeddings.table() if c.embedding_sharing == "gdes" else None
    encoder = self.generator if net == "generator" and c.embedding_sharing != "all" else self.discriminator
    # The network's dropout keys, all derived at once (a GPU kernel): the embeddings' first, then each layer's.
    keys = None
    if not deterministic and (c.dropout_rate > 0.0 or c.attention_dropout_rate > 0.0):
      keys = sampling.keys(self.make_rng("dropout"), (encoder.encoder.num_layers + 1, 2))
    x = emb(input_ids, segment_ids, dropout_key=None if keys is None or c.dropout_rate == 0.0 else keys[0, 0],
            gdes_base=base)
    # Both our SentencePiece models and Google's WordPiece vocabularies put [PAD] at id 0.
    return encoder(x, input_ids != 0, None if keys is None else keys[1:]), emb.table(base)

  def generator_logits(self, input_ids, segment_ids, positions, *, deterministic: bool = True):
    """MLM logits [B, P, V] of the generator at `positions` [B, P] only."""
    h, table = self._encode("generator", input_ids, segment_ids, deterministic)
    return self.generator_head(gather_positions(h, positions), table)

  def discriminator_logits(self, input_ids, segment_ids, *, deterministic: bool = True):
    """Replaced-token logits [B, L] of the discriminator."""
    h, _ = self._encode("discriminator", input_ids, segment_ids, deterministic)
    return self.discriminator_head(h)

  def discriminator_mlm_logits(self, input_ids, segment_ids, positions=None, *, copy: bool = False,
                               deterministic: bool = True):
    """D as a masked LM: logits at `positions` [B, P, V] or everywhere [B, L, V]; `copy`: and the copy gate [B, L]."""
    h, table = self._encode("discriminator", input_ids, segment_ids, deterministic)
    logits = self.discriminator_mlm_head(h if positions is None else gather_positions(h, positions), table)
    return (logits, self.discriminator_head(h)) if copy else logits

  def encode(self, input_ids, segment_ids, *, deterministic: bool = True):
    """The discriminator's final hidden states [B, L, H]: what fine-tuning builds on."""
    return self._encode("discriminator", input_ids, segment_ids, deterministic)[0]
