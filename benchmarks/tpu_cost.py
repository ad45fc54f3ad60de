"""Where a pre-training step's estimated TPU time goes: the TPU cost model (compiled.cost_analysis()'s
optimal_seconds, what electra-compile reports) for the whole train step and for its pieces, each compiled apart for
a described slice (no TPU needed; libtpu, the `tpu` extra).

  python benchmarks/tpu_cost.py --config=configs/small.py --tpu=v3-8 --pieces=step,step_1,generator_1,discriminator_1

Pieces (--pieces, comma-separated; "_1" ones run on ONE core of the slice at its share of the batch, so they hold no
collective, and step minus step_1 is what the slice's collectives and partitioning cost):
  step            the train step on the whole slice (electra-compile's)
  step_1          the train step on one core
  grad_1          mask, G, sample, D, losses and their gradient, without the optimiser's update
  masking_1       choosing the masked positions and building G's input
  generator_1     G's forward and backward with its MLM loss, at the masked positions
  mlm_head_1      G's MLM head and loss alone (from G's final hidden states at the masked positions)
  sampling_1      one sample from G's softmax at each masked position
  discriminator_1 D's forward and backward with its replaced-token loss
  embeddings_1    the embedding block's forward and backward (both networks look their inputs up in it)
  attention_1     one of D's layers' attention core (modeling.attention: scores, mask, softmax, dropout, x V), forward
                  and backward, from its q, k, v; generator_attention_1 the same at G's heads
  update_1        the optimiser's update of every parameter from a gradient
--hlo=PREFIX writes each piece's optimized HLO (libtpu annotates each operation with its own "estimated_cycles", a
different estimate from optimal_seconds: use it to find an operation, not to add up a step). The config's overrides
(--config.model.x=y) apply as in electra-compile. docs/tpu.md ("Where the estimated step goes") has what it found.
"""
import os
import sys
import time

import jax
import jax.numpy as jnp
from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from electra_jax.data.special_ids import SpecialIds
from electra_jax.model import flops, losses, masking, modeling, objectives, sampling
from electra_jax.parallel import optim, sharding, topology
from electra_jax.pretrain import experiment
# pylint: enable=g-import-not-at-top,wrong-import-position

_CONFIG = config_flags.DEFINE_config_file("config", None, "A pre-training config file.", lock_config=True)
_TPU = flags.DEFINE_string("tpu", "v3-8", "The accelerator type (gcloud's names).")
_PIECES = flags.DEFINE_list("pieces", ["step"], "Which pieces to compile (see the docstring).")
_HLO = flags.DEFINE_string("hlo", "", "Write each piece's optimized HLO to this prefix + the piece's name + .txt.")


def _setup(config, devices):
  exp = experiment.create(config, SpecialIds(), devices=devices)
  _, _, (state, batch, rng) = experiment.compile_targets(exp)[0]
  return exp, state, batch, rng


def _struct(shape, dtype, sharding):
  return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def _loss_batch(exp, params, ids, seg, masked, keys, deterministic=False):
  rows = jnp.arange(ids.shape[0])
  return losses.Batch(exp.model, params, ids, seg, exp.special, masked, (ids != 0).astype(jnp.float32), keys, rows,
                      deterministic, exp.objective)


def _keys(rng):
  return dict(zip(("sample", "generator", "discriminator"), jax.random.split(rng, 3)))


def pieces(config, devices):
  """name -> (jitted function, abstract arguments) for the requested pieces."""
  c = config
  exp, state, batch, rng = _setup(c, devices)
  sh = exp.sharded
  p = masking.max_predictions(c.objective.mask_prob, c.data.seq_len)
  rows, vocab = c.train.batch_size, c.data.vocab_size
  ids, seg = batch["input_ids"], batch["segment_ids"]
  pos = _struct((rows, p), jnp.int32, sh.batch)
  wts = _struct((rows, p), jnp.float32, sh.batch)
  masked = masking.Masked(ids, pos, pos, wts)
  tx = optim.build(experiment.recipe(c.train)).tx

  def jit(fn, in_shardings, out_shardings=None):
    def traced(*args):
      with sharding.activation_rules(sh.mesh):
        return fn(*args)
    return jax.jit(traced, in_shardings=in_shardings, out_shardings=out_shardings)

  def grad_of(loss):
    return lambda params, *args: jax.value_and_grad(loss, has_aux=True)(params, *args)

  def gen_loss(params, masked_, s, r):
    loss, out, _ = losses.generator_mlm(_loss_batch(exp, params, masked_.input_ids, s, masked_, _keys(r)))
    return loss, out

  def disc_loss(params, corrupted, s, replaced, r):
    b = _loss_batch(exp, params, corrupted, s, None, _keys(r))
    return losses.replaced_token_detection(b, corrupted, replaced, b.non_pad)

  def emb_loss(params, i, s, r):  # two lookups, as G's input and D's are looked up in the shared block
    def one(x):
      e = exp.model.apply({"params": params}, x, s, rngs={"dropout": r},
                          method=lambda m, a, b: m.embeddings(a, b, deterministic=False))
      return jnp.mean(e.astype(jnp.float32) ** 2)
    return one(i) + one(i + 1), {}

  def head_loss(params, h, masked_):  # G's MLM head on its final hidden states at the masked positions, and the loss
    logits = exp.model.apply({"params": params}, h, method=lambda m, x: m.generator_head(x, m.embeddings.table()))
    return losses.mlm_loss(logits, masked_.targets, masked_.weights)

  def attention(encoder):  # forward and backward (a vjp) of the attention core at one encoder's heads
    m = exp.model.config
    qkv = _struct((rows, c.data.seq_len, encoder.num_heads, encoder.hidden_size // encoder.num_heads), m.compute_dtype,
                  sh.batch)

    def fn(q, k, v, mask, r, g):
      out, vjp = jax.vjp(lambda *x: modeling.attention(*x, mask, m.attention_dropout_rate, r), q, k, v)
      return out, vjp(g)
    return (jit(fn, (sh.batch,) * 4 + (sh.replicated, sh.batch)),
            (qkv, qkv, qkv, _struct((rows, c.data.seq_len), jnp.bool_, sh.batch), rng, qkv))

  def grad_step(params, b, r):
    return grad_of(lambda pr, bb, rr: objectives.compute_loss(exp.model, pr, bb, rr, exp.objective, exp.special))(
        params, b, r)

  def update(st, grads):
    upd, opt = tx.update(grads, st.opt_state, st.params)
    return st.replace(params=jax.tree.map(jnp.add, st.params, upd), opt_state=opt)

  params_sh = sh.state.params
  table = {
      "step": lambda: (exp.step, (state, batch, rng)),
      "grad": lambda: (jit(grad_step, (params_sh, sh.batch, sh.replicated), (sh.replicated, params_sh)),
                       (state.params, batch, rng)),
      "masking": lambda: (jit(lambda i, r: masking.mask_tokens(r, i, exp.special, c.objective.mask_prob, vocab),
                              (sh.batch, sh.replicated)), (ids, rng)),
      "generator": lambda: (jit(grad_of(gen_loss), (params_sh, masking.Masked(*(sh.batch,) * 4), sh.batch,
                                                     sh.replicated)), (state.params, masked, seg, rng)),
      "sampling": lambda: (jit(lambda r, x: sampling.sample(r, x, 1.0), (sh.replicated, sh.batch)),
                           (rng, _struct((rows, p, vocab), jnp.float32, sh.batch))),
      "discriminator": lambda: (jit(grad_of(disc_loss), (params_sh, sh.batch, sh.batch, sh.batch, sh.replicated)),
                                (state.params, ids, seg, _struct((rows, c.data.seq_len), jnp.bool_, sh.batch), rng)),
      "mlm_head": lambda: (jit(grad_of(head_loss), (params_sh, sh.batch, masking.Masked(*(sh.batch,) * 4))),
                           (state.params, _struct((rows, p, exp.model.config.generator.hidden_size),
                                                  exp.model.config.compute_dtype, sh.batch), masked)),
      "embeddings": lambda: (jit(grad_of(emb_loss), (params_sh, sh.batch, sh.batch, sh.replicated)),
                             (state.params, ids, seg, rng)),
      "update": lambda: (jit(update, (sh.state, params_sh), sh.state), (state, state.params)),
      "attention": lambda: attention(exp.model.config.discriminator),
      "generator_attention": lambda: attention(exp.model.config.generator),
  }
  return exp, table


def _cost(compiled):
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return cost


def main(_):
  config = _CONFIG.value
  slice_ = topology.parse(_TPU.value)
  devices = slice_.devices()
  names = _PIECES.value
  per_core = config.copy_and_resolve_references()
  with per_core.unlocked():
    per_core.train.batch_size = config.train.batch_size // len(devices)
    per_core.mesh.update(data=1, fsdp=1)
  peak = flops.peak_flops(devices[0])
  model_flops = flops.step_flops(config) / len(devices)
  print(f"{config.model.size} on {slice_.name}: {config.train.batch_size} x {config.data.seq_len}, "
        f"{model_flops / 1e9:.1f} model GFLOP per core per step ({model_flops / peak * 1e3:.2f} ms at peak)")
  tables = {}
  for name in names:
    whole = not name.endswith("_1")
    key = "all" if whole else "one"
    if key not in tables:
      tables[key] = pieces(config if whole else per_core, devices if whole else devices[:1])[1]
    fn, args = tables[key][name.removesuffix("_1")]()
    t0 = time.perf_counter()
    compiled = fn.lower(*args).compile()
    cost = _cost(compiled)
    seconds = cost.get("optimal_seconds", float("nan"))
    print(f"{name:16s} est. {seconds * 1e3:8.3f} ms  XLA {cost.get('flops', 0) / 1e9:8.2f} GFLOP/core  "
          f"bytes {cost.get('bytes accessed', 0) / 2**20:9.1f} MiB  (compiled in {time.perf_counter() - t0:.0f} s)",
          flush=True)
    if _HLO.value:
      with open(f"{_HLO.value}{name}.txt", "w") as f:
        f.write(compiled.as_text())


if __name__ == "__main__":
  flags.mark_flag_as_required("config")
  app.run(main)
