"""What pins us to the official ELECTRA code (google-research/electra) where docs/fidelity.md says we follow it: its
optimiser step for step, its layer-wise LR decay, its weight-decay mask, and continued pre-training from checkpoints
of the shapes Google released."""
import functools
import importlib
import os
import random
import re
import subprocess
import sys

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base as base_preset
from configs import small_plus as small_plus_preset
from electra_jax import config as config_lib
from electra_jax.finetune import experiment
from electra_jax.finetune import config as finetune_config
from electra_jax.finetune import model as model_lib
from electra_jax.hf import tokenizer as hf_tokenizer
from electra_jax.model import modeling, objectives
from electra_jax.parallel import optim
from electra_jax.pretrain import experiment as pretrain_experiment
from electra_jax.pretrain import loop as pretrain_loop
from electra_jax.run import weights
from tests import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXCLUDE_FROM_WEIGHT_DECAY = ["LayerNorm", "layer_norm", "bias"]  # model/optimization.py's create_optimizer


# --- The official update rule, transcribed into NumPy from model/optimization.py ------------------------------------

def _official_layer_lrs(learning_rate, layer_decay, n_layers):
  """_get_layer_lrs: {variable-name key: its learning rate}."""
  key_to_depths = {"/embeddings/": 0, "/embeddings_project/": 0, "task_specific/": n_layers + 2}
  for layer in range(n_layers):
    key_to_depths["encoder/layer_" + str(layer) + "/"] = layer + 1
  return {key: learning_rate * (layer_decay ** (n_layers + 2 - depth)) for key, depth in key_to_depths.items()}


def _official_steps(params, grads_per_step, learning_rate, num_train_steps, warmup_steps, weight_decay_rate,
                    layer_decay=None, n_layers=None):
  """create_optimizer + AdamWeightDecayOptimizer on {TF variable name: float64 array}, one dict per step: the
  parameters after each step."""
  m = {name: np.zeros_like(p) for name, p in params.items()}
  v = {name: np.zeros_like(p) for name, p in params.items()}
  params = dict(params)
  history = []
  for global_step, grads in enumerate(grads_per_step):
    step = min(global_step, num_train_steps)  # tf.train.polynomial_decay(..., end_learning_rate=0, power=1)
    lr = learning_rate * (1 - step / num_train_steps) ** 1.0
    lr *= min(1.0, global_step / warmup_steps)
    lrs = {name: lr for name in params}
    if layer_decay is not None:
      layer_lrs = _official_layer_lrs(lr, layer_decay, n_layers)
      lrs = {name: next(layer_lrs[key] for key in layer_lrs if key in name) for name in params}
    global_norm = np.sqrt(sum((g ** 2).sum() for g in grads.values()))  # tf.clip_by_global_norm(grads, 1.0)
    grads = {name: g * 1.0 / max(global_norm, 1.0) for name, g in grads.items()}
    for name, g in grads.items():
      next_m = 0.9 * m[name] + (1.0 - 0.9) * g
      next_v = 0.999 * v[name] + (1.0 - 0.999) * np.square(g)
      update = next_m / (np.sqrt(next_v) + 1e-6)
      if weight_decay_rate > 0 and not any(re.search(r, name) for r in EXCLUDE_FROM_WEIGHT_DECAY):
        update += weight_decay_rate * params[name]
      params[name] = params[name] - lrs[name] * update
      m[name], v[name] = next_m, next_v
    history.append(dict(params))
  return history


def _run_ours(tx, tree, grads_per_step):
  """Our optimiser's parameters after each step, flattened to {our "/" path: array}."""
  state, history = tx.init(tree), []
  update = jax.jit(tx.update)
  for grads in grads_per_step:
    updates, state = update(grads, state, tree)
    tree = jax.tree.map(lambda p, u: p + u, tree, updates)
    history.append({"/".join(k): np.asarray(x) for k, x in flax.traverse_util.flatten_dict(tree).items()})
  return history


def _random_problem(shapes: dict, steps: int, seed: int = 0):
  """(params, per-step gradients) as {path: float32 array}: gradient norms from ~0.3 to ~3, so global-norm clipping
  acts on some steps and not on others; parameters far from 0 so that weight decay shows."""
  rng = np.random.default_rng(seed)
  params = {k: rng.normal(0, 1, s).astype(np.float32) for k, s in shapes.items()}
  grads = []
  for scale in np.geomspace(0.05, 0.6, steps):
    grads.append({k: (scale * rng.normal(0, 1, s)).astype(np.float32) for k, s in shapes.items()})
  return params, grads


def _tree(flat):
  return flax.traverse_util.unflatten_dict({tuple(k.split("/")): jnp.asarray(x) for k, x in flat.items()})


def _assert_steps_equal(ours, theirs, names):
  """Step by step, our parameter at each path equals the official one at its TF variable name."""
  assert len(ours) == len(theirs)
  for step, (a, b) in enumerate(zip(ours, theirs)):
    for path, name in names.items():
      np.testing.assert_allclose(a[path], b[name], rtol=2e-5, atol=2e-6, err_msg=f"step {step}: {path}")


@pytest.mark.parametrize("flat", [False, True])
def test_official_pretraining_optimizer_is_the_official_update_rule(flat):
  """train.optimizer=official, 8 steps (warm-up 3 of 10, clipping on and off), against the NumPy transcription, per
  array and flat (train.flat_update); LayerNorm parameters and biases must not decay, kernels and embedding tables
  must."""
  names = {  # our path -> the official variable name of the same weight
      "embeddings/word_embeddings": "electra/embeddings/word_embeddings",
      "embeddings/LayerNorm/scale": "electra/embeddings/LayerNorm/gamma",
      "embeddings/LayerNorm/bias": "electra/embeddings/LayerNorm/beta",
      "discriminator/layer_0/attention/query/kernel": "electra/encoder/layer_0/attention/self/query/kernel",
      "discriminator/layer_0/attention/query/bias": "electra/encoder/layer_0/attention/self/query/bias",
      "discriminator/layer_0/output_LayerNorm/scale": "electra/encoder/layer_0/output/LayerNorm/gamma",
      "generator_head/bias": "generator_predictions/output_bias",
  }
  shapes = {"embeddings/word_embeddings": (7, 3), "embeddings/LayerNorm/scale": (3,),
            "embeddings/LayerNorm/bias": (3,), "discriminator/layer_0/attention/query/kernel": (3, 4),
            "discriminator/layer_0/attention/query/bias": (4,), "discriminator/layer_0/output_LayerNorm/scale": (4,),
            "generator_head/bias": (7,)}
  params, grads = _random_problem(shapes, steps=8)
  train_cfg = config_lib.base("tiny").train
  train_cfg.update(optimizer="official", learning_rate=0.05, warmup_steps=3, num_steps=10, weight_decay=0.3)
  train_cfg.flat_update = flat
  tx = optim.build(pretrain_experiment.recipe(train_cfg)).tx
  ours = _run_ours(tx, _tree(params), [_tree(g) for g in grads])
  as_official = lambda flat: {names[k]: x.astype(np.float64) for k, x in flat.items()}
  theirs = _official_steps(as_official(params), [as_official(g) for g in grads], 0.05, 10, 3, 0.3)
  _assert_steps_equal(ours, theirs, names)
  # and the recipe does differ from today's AdamW default on the same problem
  train_cfg.optimizer = "adamw"
  adamw = _run_ours(optim.build(pretrain_experiment.recipe(train_cfg)).tx, _tree(params), [_tree(g) for g in grads])
  assert not np.allclose(adamw[-1]["embeddings/word_embeddings"], ours[-1]["embeddings/word_embeddings"])
  # AdamW's update is the same flat as per array
  train_cfg.flat_update = not flat
  per_array = _run_ours(optim.build(pretrain_experiment.recipe(train_cfg)).tx, _tree(params),
                        [_tree(g) for g in grads])
  _assert_steps_equal(adamw, per_array, {k: k for k in names})


@pytest.mark.parametrize("flat", [False, True])
def test_official_finetuning_optimizer_is_the_official_update_rule(flat):
  """Fine-tuning's optimiser with train.optimizer=official and layer decay 0.8, 6 steps (warm-up 30% of 10 steps),
  against the NumPy transcription with _get_layer_lrs' per-variable learning rates; per array and flat."""
  names = {
      "electra/embeddings/word_embeddings": "electra/embeddings/word_embeddings",
      "electra/embeddings/LayerNorm/bias": "electra/embeddings/LayerNorm/beta",
      "electra/discriminator/embeddings_project/kernel": "electra/embeddings_project/kernel",
      "electra/discriminator/layer_0/intermediate/kernel": "electra/encoder/layer_0/intermediate/dense/kernel",
      "electra/discriminator/layer_1/output_LayerNorm/scale": "electra/encoder/layer_1/output/LayerNorm/gamma",
      "electra/discriminator/layer_1/output/bias": "electra/encoder/layer_1/output/dense/bias",
      "classifier/out_proj/kernel": "task_specific/classifier/kernel",
      "classifier/out_proj/bias": "task_specific/classifier/bias",
  }
  shapes = {"electra/embeddings/word_embeddings": (7, 3), "electra/embeddings/LayerNorm/bias": (3,),
            "electra/discriminator/embeddings_project/kernel": (3, 4),
            "electra/discriminator/layer_0/intermediate/kernel": (4, 5),
            "electra/discriminator/layer_1/output_LayerNorm/scale": (4,),
            "electra/discriminator/layer_1/output/bias": (4,), "classifier/out_proj/kernel": (4, 2),
            "classifier/out_proj/bias": (2,)}
  params, grads = _random_problem(shapes, steps=6, seed=1)
  train_cfg = finetune_config.base_config().train
  train_cfg.update(optimizer="official", learning_rate=0.05, warmup_fraction=0.3, layer_decay=0.8, weight_decay=0.3)
  train_cfg.flat_update = flat
  tx = optim.build(experiment.recipe(train_cfg, num_steps=10, num_layers=2)).tx
  ours = _run_ours(tx, _tree(params), [_tree(g) for g in grads])
  as_official = lambda flat: {names[k]: x.astype(np.float64) for k, x in flat.items()}
  theirs = _official_steps(as_official(params), [as_official(g) for g in grads], 0.05, 10, 10 * 0.3, 0.3,
                           layer_decay=0.8, n_layers=2)
  _assert_steps_equal(ours, theirs, names)


def test_a_wrong_optimizer_is_refused():
  """By both optimisers' builders, and by electra-pretrain in one line naming the key."""
  message = "train.optimizer='adam': expected one of adamw, official"
  train_cfg = config_lib.base("tiny").train
  train_cfg.optimizer = "adam"
  with pytest.raises(ValueError, match=re.escape(message)):
    pretrain_experiment.recipe(train_cfg)
  ft = finetune_config.base_config().train
  ft.optimizer = "adam"
  with pytest.raises(ValueError, match=re.escape(message)):
    experiment.recipe(ft, num_steps=10, num_layers=2)


@pytest.mark.slow
def test_a_wrong_optimizer_is_one_line_from_the_cli(tiny_data, tmp_path):
  r = subprocess.run([sys.executable, "-m", "electra_jax.pretrain", "--config=configs/tiny.py",
                      f"--config.data.data_dir={tiny_data[0].data.data_dir}", "--config.train.optimizer=adam",
                      f"--workdir={tmp_path / 'run'}"], cwd=ROOT, capture_output=True, text=True,
                     env=dict(os.environ, PYTHONPATH=ROOT), timeout=300)
  helpers.assert_one_line_error(r, "train.optimizer='adam': expected one of adamw, official")


# --- Layer-wise LR decay and the weight-decay mask on real parameter trees -----------------------------------------

def _official_depth(path: tuple, n_layers: int) -> int:
  """The depth _get_layer_lrs gives the official variable of our fine-tuning parameter at `path`."""
  if path[0] != "electra":
    return n_layers + 2  # task_specific/
  layer = [int(p[len("layer_"):]) for p in path if re.fullmatch(r"layer_\d+", p)]
  return layer[0] + 1 if layer else 0  # encoder/layer_i/, else /embeddings/ or /embeddings_project/


@pytest.mark.parametrize("num_layers", [12, 4])
@pytest.mark.parametrize("task_type", sorted(model_lib.MODELS))
def test_layer_decay_exponents_are_the_official_ones(num_layers, task_type):
  """Every parameter of a real fine-tuning model (ELECTRA-Small's L = 12, the demo's L = 4) gets
  decay^(L + 2 - depth): the embeddings decay^(L+2), layer i decay^(L+1-i), the head 1."""
  config = config_lib.base("small")
  config.model.num_layers = num_layers
  mc = modeling.ModelConfig.from_config(config)
  ids = jnp.ones((1, 8), jnp.int32)
  shapes = jax.eval_shape(model_lib.MODELS[task_type](mc, 3).init, jax.random.key(0), ids, ids)["params"]
  flat = flax.traverse_util.flatten_dict(flax.linen.meta.unbox(shapes))
  got, depths = {}, set()
  for path in flat:
    keys = [jax.tree_util.DictKey(k) for k in path]
    got[path] = optim.lr_multiplier(keys, num_layers, 0.8)
    depths.add(_official_depth(path, num_layers))
    np.testing.assert_allclose(got[path], 0.8 ** (num_layers + 2 - _official_depth(path, num_layers)), rtol=1e-12,
                               err_msg=str(path))
  assert depths == set(range(num_layers + 1)) | {num_layers + 2}  # no variable sits at depth L + 1
  assert got[("electra", "embeddings", "word_embeddings")] == pytest.approx(0.8 ** (num_layers + 2))
  assert got[("electra", "discriminator", "layer_0", "attention", "query", "kernel")] == pytest.approx(
      0.8 ** (num_layers + 1))
  last = ("electra", "discriminator", f"layer_{num_layers - 1}", "output", "kernel")
  assert got[last] == pytest.approx(0.8 ** 2)


@pytest.mark.parametrize("sharing", modeling.SHARING_MODES)
def test_weight_decay_mask_is_the_official_one(sharing):
  """Every parameter of pre-training (each embedding-sharing mode) and of every fine-tuning head decays exactly when
  its name does not match the official LayerNorm|layer_norm|bias (our names are HF's, which keep those words)."""
  config = config_lib.base("tiny")
  config.data.vocab_size = 100
  config.objective.embedding_sharing = sharing
  config.model.generator_fraction = 1.0 if sharing == "all" else 0.5
  mc = modeling.ModelConfig.from_config(config)
  trees = [flax.linen.meta.unbox(jax.eval_shape(functools.partial(
      objectives.init_params, modeling.Electra(mc), config.objective.name, config.data.seq_len), jax.random.key(0)))]
  ids = jnp.ones((1, 8), jnp.int32)
  trees += [flax.linen.meta.unbox(jax.eval_shape(cls(mc, 3).init, jax.random.key(0), ids, ids)["params"])
            for cls in set(model_lib.MODELS.values())]
  for tree in trees:
    for path, decays in flax.traverse_util.flatten_dict(optim.decay_mask(tree)).items():
      name = "/".join(path)
      assert decays == (not any(re.search(r, name) for r in EXCLUDE_FROM_WEIGHT_DECAY)), name


# --- Continued pre-training from Google's released shapes -----------------------------------------------------------

# (hidden, heads, FFN, embedding) of the released discriminators and generators (their HF config.json files). Large
# (1024, 16, 4096, 1024) with a (256, 4, 1024, 1024) generator loads as Base does (embeddings as wide as the
# discriminator, a narrower generator projecting them): Base's case guards that path, and the presets' generator
# shapes are checked apart (test_generator_is_the_official_generator_config) without a minute of Large's compiling.
RELEASED = {
    "small_plus": (small_plus_preset, (256, 4, 1024, 128), (256, 4, 1024, 128)),
    "base": (base_preset, (768, 12, 3072, 768), (256, 4, 1024, 768)),
}


def _released_shape_dirs(tmp_path, disc_size, gen_size, num_layers, tokenizer_path, vocab_size):
  """A random HF discriminator and generator of a release's widths (at num_layers), in two directories as Google's
  are, their embeddings shared."""
  import transformers  # pylint: disable=g-import-not-at-top
  def hf_config(size):
    hidden, heads, ffn, embedding = size
    return transformers.ElectraConfig(vocab_size=vocab_size, embedding_size=embedding, hidden_size=hidden,
                                      num_attention_heads=heads, intermediate_size=ffn, num_hidden_layers=num_layers,
                                      max_position_embeddings=512, hidden_act="gelu")
  disc = transformers.ElectraForPreTraining(hf_config(disc_size))
  gen = transformers.ElectraForMaskedLM(hf_config(gen_size))
  gen.electra.embeddings.load_state_dict(disc.electra.embeddings.state_dict())
  disc_dir, gen_dir = tmp_path / "discriminator", tmp_path / "generator"
  disc.save_pretrained(disc_dir)
  gen.save_pretrained(gen_dir)
  hf_tokenizer.save_tokenizer(tokenizer_path, str(disc_dir), 512)
  return str(disc_dir), str(gen_dir)


@pytest.mark.slow
@pytest.mark.parametrize("preset", sorted(RELEASED))
def test_pretraining_continues_from_a_released_shape(preset, tiny_data, tmp_path):
  """configs/<preset>.py (at 1 layer) with train.init_from=<a discriminator of the release's widths> and
  train.init_from_generator=<its generator> trains, and with lr 0 both networks come back unchanged."""
  module, disc_size, gen_size = RELEASED[preset]
  config = helpers.tiny_config(tiny_data)
  release = module.get_config()
  config.model.update(release.model.to_dict())
  config.objective.update(release.objective.to_dict())
  config.model.update(num_layers=1, dtype="float32", remat=False)
  disc_dir, gen_dir = _released_shape_dirs(tmp_path, disc_size, gen_size, 1, tiny_data[1].tokenizer_path,
                                           config.data.vocab_size)
  config.train.update(init_from=disc_dir, init_from_generator=gen_dir, learning_rate=0.0, num_steps=1,
                      batch_size=8, eval_every=1, eval_batches=1)
  pretrain_loop.train_and_evaluate(config, str(tmp_path / "run"))
  restored = weights.load(str(tmp_path / "run")).params
  released = weights.load(disc_dir, generator=gen_dir).params
  jax.tree.map(np.testing.assert_array_equal, restored, released)
  assert restored["generator_head"]["dense"]["kernel"].shape == (gen_size[0], gen_size[3])


# --- Model sizes and the data builder -------------------------------------------------------------------------------

@pytest.mark.parametrize("preset", ["small", "small_plus", "base", "large"])
def test_generator_is_the_official_generator_config(preset):
  """run_pretraining.get_generator_config: hidden round(H · generator_hidden_size), the same depth, FFN 4 · hidden,
  max(1, hidden // 64) heads; ours scales heads and FFN by the fraction: the same at every preset."""
  mc = modeling.ModelConfig.from_config(importlib.import_module(f"configs.{preset}").get_config())
  d, g = mc.discriminator, mc.generator
  hidden = int(round(d.hidden_size * {"small": 0.25, "small_plus": 1.0, "base": 0.33333, "large": 0.25}[preset]))
  assert (g.hidden_size, g.num_layers, g.intermediate_size, g.num_heads) == (
      hidden, d.num_layers, 4 * hidden, max(1, hidden // 64))


class _OfficialExampleBuilder:
  """build_pretraining_dataset.py's ExampleBuilder on token ids, drawing from `rng` (the official code uses the
  random module) and starting from `target_length` (ours draws each document's first target: see below)."""

  def __init__(self, max_length, rng, target_length):
    self._current_sentences, self._current_length = [], 0
    self._max_length, self._target_length, self._rng = max_length, target_length, rng

  def add_line(self, bert_tokids):
    if (not bert_tokids) and self._current_length != 0:  # empty lines separate docs
      return self._create_example()
    self._current_sentences.append(bert_tokids)
    self._current_length += len(bert_tokids)
    if self._current_length >= self._target_length:
      return self._create_example()
    return None

  def _create_example(self):
    if self._rng.random() < 0.1:
      first_segment_target_length = 100000
    else:
      first_segment_target_length = (self._target_length - 3) // 2
    first_segment, second_segment = [], []
    for sentence in self._current_sentences:
      if (len(first_segment) == 0 or len(first_segment) + len(sentence) < first_segment_target_length or
          (len(second_segment) == 0 and len(first_segment) < first_segment_target_length and
           self._rng.random() < 0.5)):
        first_segment += sentence
      else:
        second_segment += sentence
    first_segment = first_segment[:self._max_length - 2]
    second_segment = second_segment[:max(0, self._max_length - len(first_segment) - 3)]
    self._current_sentences, self._current_length = [], 0
    if self._rng.random() < 0.05:
      self._target_length = self._rng.randint(5, self._max_length)
    else:
      self._target_length = self._max_length
    return first_segment, second_segment


def test_packing_is_the_official_example_builder(tiny_data):
  """A document of real sentences (each shorter than an example) packs into exactly the examples the official
  ExampleBuilder makes from the same random draws: segment split, the 10% single-segment and 5% short-target
  examples, the 50% rule for the sentence that crosses A's target, the trimming. The one difference, deliberate:
  each document draws its first target (the official builder carries it over from the previous document), so that
  documents pack independently of each other and of the worker count."""
  from electra_jax.data import packing  # pylint: disable=g-import-not-at-top
  from electra_jax.data import corpus as corpus_lib  # pylint: disable=g-import-not-at-top
  from electra_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  seq_len, seed = 64, 3
  tok = tokenizer_lib.Tokenizer(tiny_data[1].tokenizer_path)
  lines = [s for s in helpers.sotu_sentences()[:1500] if len(tok.encode_batch([s])[0]) <= seq_len - 2]
  doc = corpus_lib.Document(5, lines)
  ours = packing.pack_document(doc, tok, seq_len, seed)
  rng = random.Random(f"{seed}/{doc.index}")
  builder = _OfficialExampleBuilder(seq_len, rng, rng.randint(5, seq_len) if rng.random() < 0.05 else seq_len)
  examples = [e for ids in tok.encode_batch(lines) + [[]] if (e := builder.add_line(ids))]
  s = tok.special_ids
  rows = [[s.cls, *a, s.sep] + ([*b, s.sep] if b else []) for a, b in examples]
  assert len(rows) == len(ours.input_ids) > 100
  assert sum(len(b) == 0 for _, b in examples) > 10 and sum(len(r) < seq_len - 10 for r in rows) > 3
  for i, (row, (a, b)) in enumerate(zip(rows, examples)):
    np.testing.assert_array_equal(ours.input_ids[i], row + [s.pad] * (seq_len - len(row)), err_msg=f"example {i}")
    segments = [0] * (len(a) + 2) + [1] * (len(b) + 1 if b else 0)
    np.testing.assert_array_equal(ours.segment_ids[i], segments + [0] * (seq_len - len(segments)))


def test_losses_average_over_the_batchs_tokens():
  """As run_pretraining.py: D's loss is sum(loss · weight) / (1e-6 + sum(weight)) over every non-pad token of the
  batch (not a mean of per-row means), G's over every masked position of the batch."""
  from electra_jax.model import losses  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  logits, labels = rng.normal(size=(2, 6)), rng.random((2, 6)) < 0.3
  weights = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0]], np.float32)  # rows of 6 and 2 tokens
  per_token = np.logaddexp(0, -logits) * labels + np.logaddexp(0, logits) * ~labels  # sigmoid cross-entropy
  loss, _, _ = losses.disc_loss(jnp.asarray(logits), jnp.asarray(labels), jnp.asarray(weights))
  assert float(loss) == pytest.approx((per_token * weights).sum() / (1e-6 + weights.sum()), rel=1e-5)
  mlm_logits, targets = rng.normal(size=(2, 3, 11)), rng.integers(0, 11, (2, 3))
  mlm_weights = np.array([[1, 1, 1], [1, 0, 0]], np.float32)
  nll = -np.take_along_axis(mlm_logits - np.log(np.exp(mlm_logits).sum(-1, keepdims=True)), targets[..., None],
                            -1)[..., 0]
  mlm, _ = losses.mlm_loss(jnp.asarray(mlm_logits), jnp.asarray(targets), jnp.asarray(mlm_weights))
  assert float(mlm) == pytest.approx((nll * mlm_weights).sum() / (mlm_weights.sum() + 1e-6), rel=1e-5)


@pytest.mark.parametrize("preset,expected", [
    # layers, hidden, embedding, mask_prob, lr, batch, seq_len, steps, warm-up: Table 6 / configure_pretraining.py
    ("small", (12, 256, 128, 0.15, 5e-4, 128, 128, 1_000_000, 10_000)),
    ("base", (12, 768, 768, 0.15, 2e-4, 256, 512, 766_000, 10_000)),
    ("large", (24, 1024, 1024, 0.25, 2e-4, 2048, 512, 400_000, 10_000)),
])
def test_presets_are_the_papers_hyperparameters(preset, expected):
  c = importlib.import_module(f"configs.{preset}").get_config()
  assert (c.model.num_layers, c.model.hidden_size, c.model.embedding_size, c.objective.mask_prob,
          c.train.learning_rate, c.train.batch_size, c.data.seq_len, c.train.num_steps,
          c.train.warmup_steps) == expected
  assert (c.objective.disc_weight, c.objective.temperature, c.train.weight_decay, c.train.adam_eps,
          c.train.clip_norm, c.model.dropout_rate, c.model.attention_dropout_rate) == (50.0, 1.0, 0.01, 1e-6, 1.0,
                                                                                       0.1, 0.1)
