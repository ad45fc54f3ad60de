"""The paper's two-stage ELECTRA (Sec. 3.2), objective.name=two_stage, in one place: L_MLM(G) alone for the first
two_stage_fraction of the steps; at the switch step D becomes a copy of G and Adam restarts; then λ·L_Disc(D) alone on
the samples of the frozen G. Its registry entry (objectives.py) takes `loss` and `wrap_update`, the step switch."""
import functools

import jax
import jax.numpy as jnp
import ml_collections
import optax

from electra_jax.model import losses


def switch_step(config: ml_collections.ConfigDict) -> int:
  """The step (counting from 0) that starts stage 2, after a config check. D starts as a copy of G, so both need the
  same sizes and their own weights."""
  o, f = config.objective, config.model.generator_fraction
  if f != 1.0:
    raise ValueError(f"objective.name=two_stage initialises D from G, so it needs model.generator_fraction=1.0 "
                     f"(got {f})")
  if o.embedding_sharing != "untied":
    raise ValueError(f"objective.name=two_stage needs separate G and D weights: objective.embedding_sharing=untied "
                     f"(got {o.embedding_sharing!r})")
  if not 0 < o.two_stage_fraction < 1:
    raise ValueError(f"objective.two_stage_fraction={o.two_stage_fraction} must be in (0, 1)")
  return max(1, round(o.two_stage_fraction * config.train.num_steps))


def loss(b: losses.Batch, *, stage: int = 2):
  """Stage 1: L_MLM(G) alone, without running D. Stage 2: λ·L_Disc alone, G sampling through stop_gradient (no
  backward pass through G; its loss only reported). Evaluation uses 2, which reports both networks. Both stages
  return the same metric keys (0 where stage 1 computes nothing), so that lax.cond can pick one."""
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
  """params with D's embeddings and encoder replaced by G's: how stage 2 begins. D's replaced-token head has no
  counterpart in G and keeps its own weights."""
  return dict(params, discriminator_embeddings=params["generator_embeddings"], discriminator=params["generator"])


def freeze_untrained(new_params, old_params, stage2: jax.Array):
  """new_params, except that the network the current stage does not train (D in stage 1, G in stage 2) keeps
  old_params bitwise: AdamW's momentum and weight decay would move it even with zero gradients."""
  def keep(name, new, old):
    frozen = stage2 == name.startswith("generator")
    return jax.tree.map(lambda n, o: jnp.where(frozen, o, n), new, old)
  return {k: keep(k, v, old_params[k]) for k, v in new_params.items()}


def _restart_adam(opt_state, fresh):
  """opt_state with every Adam state (moments and step count) taken from `fresh`, the rest (e.g. the learning-rate
  schedule's count) kept."""
  is_adam = lambda s: isinstance(s, optax.ScaleByAdamState)
  return jax.tree.map(lambda s, f: f if is_adam(s) else s, opt_state, fresh, is_leaf=is_adam)


def wrap_update(config: ml_collections.ConfigDict, tx: optax.GradientTransformation, update):
  """`update` (experiment.py's step of the optimiser: (state, grad) -> (state, metrics)) with the step switch: the
  switch step copies G into D first, each step computes its own stage's gradient, and the update leaves the network
  that stage does not train as it was."""
  switch = switch_step(config)

  def staged(state, grad):
    # Stage 2 starts from D = G with fresh Adam moments and bias correction; the learning-rate schedule carries on.
    params, opt_state = jax.lax.cond(
        state.step == switch,
        lambda p, o: (discriminator_from_generator(p), _restart_adam(o, tx.init(p))),
        lambda p, o: (p, o), state.params, state.opt_state)
    stage2 = state.step >= switch

    def stage_grad(p):  # one stage runs per step: stage 1 never runs D, stage 2 never runs G's backward pass
      return jax.lax.cond(stage2, functools.partial(grad, stage=2), functools.partial(grad, stage=1), p)

    new, metrics = update(state.replace(params=params, opt_state=opt_state), stage_grad)
    return new.replace(params=freeze_untrained(new.params, params, stage2)), metrics
  return staged
