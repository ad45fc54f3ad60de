"""The paper's two-stage ELECTRA (Sec. 3.2), objective.name=two_stage: L_MLM(G) alone for the first
two_stage_fraction of the steps; at the switch step D becomes a copy of G and Adam restarts (parallel/update.Stages);
then λ·L_Disc(D) alone on the samples of the frozen G."""
import jax
import jax.numpy as jnp

from electra_jax.model import losses


def loss(b: losses.Batch, *, stage: int = 2):
  """Stage 1: L_MLM(G); stage 2 (and evaluation): λ·L_Disc (G's reported). The same metric keys, for lax.cond."""
  if stage == 1:
    g_loss, out, _ = losses.generator_mlm(b)
    stage2 = jax.eval_shape(lambda: loss(b))[1]  # stage 2's metric keys, traced for shapes only
    return g_loss, {k: jnp.zeros(v.shape, v.dtype) for k, v in stage2.items()} | out
  # G's forward reads only G's params, so stop_gradient on the whole tree freezes exactly G.
  _, out, g_logits = losses.generator_mlm(b, params=jax.lax.stop_gradient(b.params))
  corrupted, replaced, more = losses.corrupt(b, g_logits)
  d_loss, d_out = losses.replaced_token_detection(b, corrupted, replaced, b.non_pad)
  return b.objective.disc_weight * d_loss, out | more | d_out


def discriminator_from_generator(params):
  """params with D's embeddings and encoder replaced by G's (D's head keeps its own): how stage 2 begins."""
  return dict(params, discriminator_embeddings=params["generator_embeddings"], discriminator=params["generator"])


def trained_in_stage1(name: str) -> bool:
  """Whether the top-level parameters `name` train in stage 1 (G's) rather than stage 2 (the rest)."""
  return name.startswith("generator")
