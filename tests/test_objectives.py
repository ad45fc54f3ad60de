"""Masking, sampling, losses and labels of the objectives on many sequences."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from electra_jax.data import corpus as corpus_lib
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.data.special_ids import SpecialIds
from electra_jax.model import flops, losses, masking, objectives, sampling

SPECIAL = SpecialIds()
VOCAB = 1000


def _batch(rng, batch=512, seq_len=128):
  """[CLS] A [SEP] B [SEP] then padding, with ragged lengths."""
  ids = rng.integers(5, VOCAB, (batch, seq_len)).astype(np.int32)
  lengths = rng.integers(seq_len // 4, seq_len + 1, batch)
  for i, n in enumerate(lengths):
    ids[i, 0] = SPECIAL.cls
    ids[i, n // 2] = SPECIAL.sep
    ids[i, n - 1] = SPECIAL.sep
    ids[i, n:] = SPECIAL.pad
  return jnp.asarray(ids)


def _words(ids, starts, special=SPECIAL):
  """[B, L] each position's word (-1 at [CLS], [SEP] and padding), counted apart from masking.mask_words: a word
  starts at a piece `starts` marks or at any piece after a special token or padding."""
  words = np.full(ids.shape, -1)
  for r, row in enumerate(ids):
    word, previous = -1, False
    for i, t in enumerate(row):
      if t in (special.pad, special.cls, special.sep):
        previous = False
        continue
      word += bool(starts[t]) or not previous
      words[r, i], previous = word, True
  return words


def _check_whole_words(ids, m, mask_prob, words):
  """Chosen positions are words, whole, as BERT chooses them: within round(mask_prob · n) of a row's n maskable
  tokens (and max_predictions), skipping a word that does not fit, so that no word left out fits the budget's rest."""
  chosen = np.zeros(ids.shape, bool)
  np.put_along_axis(chosen, np.asarray(m.positions), np.asarray(m.weights) > 0, axis=1)
  p = masking.max_predictions(mask_prob, ids.shape[1])
  for r in range(len(ids)):
    assert not (chosen[r] & (words[r] < 0)).any(), "chose [CLS], [SEP] or padding"
    lengths = np.bincount(words[r][words[r] >= 0])
    taken = np.bincount(words[r][chosen[r]], minlength=len(lengths))
    assert ((taken == 0) | (taken == lengths)).all(), f"row {r}: a word masked in part"
    budget = min(p, max(1, round((words[r] >= 0).sum() * mask_prob)))
    assert chosen[r].sum() <= budget
    left_out = lengths[(taken == 0) & (lengths > 0)]
    assert (left_out > budget - chosen[r].sum()).all(), f"row {r}: a word left out fits the budget"
  return chosen


@pytest.mark.parametrize("mask_prob", [0.15, 0.25])
@pytest.mark.parametrize("whole_words", [False, True])
def test_masking_statistics(mask_prob, whole_words):
  """mask_tokens, and mask_words where 60% of the vocabulary starts a word (words of 1.7 pieces on average)."""
  ids = _batch(np.random.default_rng(0))
  if whole_words:
    starts = np.random.default_rng(1).random(VOCAB) < 0.6
    m = masking.mask_words(jax.random.key(0), ids, SPECIAL, mask_prob, VOCAB, word_starts=starts)
    _check_whole_words(np.asarray(ids), m, mask_prob, _words(np.asarray(ids), starts))
  else:
    m = masking.mask_tokens(jax.random.key(0), ids, SPECIAL, mask_prob, VOCAB)
  ids, masked, pos, w = map(np.asarray, (ids, m.input_ids, m.positions, m.weights))
  chosen = np.zeros(ids.shape, bool)
  np.put_along_axis(chosen, pos, w > 0, axis=1)
  candidates = (ids != SPECIAL.pad) & (ids != SPECIAL.cls) & (ids != SPECIAL.sep)
  assert not (chosen & ~candidates).any(), "chose [CLS], [SEP] or padding"
  assert (chosen.sum(1) <= masking.max_predictions(mask_prob, ids.shape[1])).all()
  assert abs(chosen.sum() / candidates.sum() - mask_prob) <= 0.01
  # Targets are the original ids at the chosen positions; nothing outside them changes.
  np.testing.assert_array_equal(np.take_along_axis(ids, pos, 1)[w > 0], m.targets[w > 0])
  assert (masked[~chosen] == ids[~chosen]).all()
  mask_fraction = (masked[chosen] == SPECIAL.mask).mean()
  assert abs(mask_fraction - 0.85) < 0.02
  assert (masked[chosen & (masked != SPECIAL.mask)] == ids[chosen & (masked != SPECIAL.mask)]).all(), \
      "ELECTRA keeps the other 15% unchanged (no random tokens)"


def _wordpiece(tmp_path, lines):
  """A Tokenizer for a 1000-piece WordPiece vocab.txt trained on `lines` (BERT's special tokens), and the words of
  each line as the WordPiece pre-tokenizer splits them."""
  from tokenizers import BertWordPieceTokenizer  # pylint: disable=g-import-not-at-top
  trainer = BertWordPieceTokenizer(lowercase=True)
  trainer.train_from_iterator(lines, vocab_size=1000, special_tokens=list(tokenizer_lib.SPECIAL_TOKENS))
  trainer.save_model(str(tmp_path))
  tok = tokenizer_lib.Tokenizer(str(tmp_path / "vocab.txt"))
  encoded = tok.wordpiece.encode_batch(lines, add_special_tokens=False)
  return tok, [(e.ids, e.word_ids) for e in encoded]


def _sentencepiece(path, lines):
  """The Tokenizer at `path`, and the words of each line: a piece that begins with U+2581 starts one."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  sp = spm.SentencePieceProcessor(model_file=path)
  pieces = sp.encode(lines, out_type=str)
  return tokenizer_lib.Tokenizer(path), [(sp.piece_to_id(p), np.cumsum([q.startswith("\u2581") for q in p]))
                                         for p in pieces]


def _pack(encoded, special, seq_len=128):
  """Rows [CLS] A [SEP] B [SEP] (then padding) of pairs of lines, B from its second piece (a segment may begin inside
  a word), and each position's word (-1 at specials and padding; a segment's words numbered apart)."""
  half = (seq_len - 3) // 2
  ids = np.full((len(encoded) // 2, seq_len), special.pad, np.int32)
  words = np.full(ids.shape, -1)
  for r in range(len(ids)):
    (a, a_words), (b, b_words) = encoded[2 * r], encoded[2 * r + 1]
    a, a_words, b, b_words = a[:half], list(a_words[:half]), b[1:half + 1], list(b_words[1:half + 1])
    row = [special.cls, *a, special.sep, *b, special.sep]
    ids[r, :len(row)] = row
    words[r, 1:1 + len(a)] = np.asarray(a_words) + 1_000 * 2 * r
    words[r, 2 + len(a):2 + len(a) + len(b)] = np.asarray(b_words) + 1_000 * (2 * r + 1)
  return ids, words


@pytest.mark.parametrize("kind", ["sentencepiece", "wordpiece"])
def test_whole_word_masking_on_real_text(kind, tiny_data, tmp_path):
  """Whole-word masking of real text, tokenized by the SentencePiece model electra-prepare trains and by a WordPiece
  vocab.txt: the tokenizer's word starts mark exactly where its own words begin (after a special, any piece begins
  one), and every masked word is masked whole, within the budget, at mask_prob of the tokens over 256 rows."""
  lines = [line for line in corpus_lib.Corpus(max_documents=40).lines() if len(line.split()) >= 5][:512]
  if kind == "wordpiece":
    tok, encoded = _wordpiece(tmp_path, lines)
  else:
    tok, encoded = _sentencepiece(tiny_data[1].tokenizer_path, lines)
  starts = tok.word_starts()
  s = tok.special_ids
  assert len(starts) == tok.vocab_size and not any(starts[i] for i in (s.pad, s.cls, s.sep, s.mask))
  assert starts[s.unk] == (kind == "wordpiece")  # WordPiece's [UNK] is a whole word
  ids, words = _pack(encoded, tok.special_ids)
  for r in range(len(ids)):  # numbering the rows' words from the tokenizer's table gives the tokenizer's words
    counted = _words(ids[r:r + 1], starts, tok.special_ids)[0]
    assert (np.unique(words[r], return_inverse=True)[1] == np.unique(counted, return_inverse=True)[1]).all(), r
  mask_prob = 0.15
  m = jax.jit(functools.partial(masking.mask_words, special=tok.special_ids, mask_prob=mask_prob,
                                vocab_size=tok.vocab_size, word_starts=starts))(jax.random.key(0), jnp.asarray(ids))
  chosen = _check_whole_words(ids, m, mask_prob, words)
  assert abs(chosen.sum() / (words >= 0).sum() - mask_prob) <= 0.01
  assert (words[chosen] >= 0).all() and len(np.unique(words[chosen])) < chosen.sum()  # words of several pieces


def test_bert_recipe_80_10_10():
  ids = _batch(np.random.default_rng(1))
  m = masking.mask_tokens(jax.random.key(1), ids, SPECIAL, 0.15, VOCAB, bert_recipe=True)
  w = np.asarray(m.weights) > 0
  new = np.take_along_axis(np.asarray(m.input_ids), np.asarray(m.positions), 1)[w]
  orig = np.asarray(m.targets)[w]
  assert abs((new == SPECIAL.mask).mean() - 0.8) < 0.02
  assert abs(((new != SPECIAL.mask) & (new != orig)).mean() - 0.1) < 0.02
  assert abs((new == orig).mean() - 0.1) < 0.02


@pytest.mark.parametrize("block", [0, 10, 8])  # one short block; 5 whole blocks; 6 blocks and a shorter last one
def test_sampling_follows_softmax_and_temperature(block):
  """Frequencies of 40k draws over a 50-token vocabulary match softmax(logits / T) by a chi-square test (p > 1e-4
  fails a correct sampler once in 10,000 runs; the most likely token 25% too likely fails it), for every way the
  two-level inverse CDF cuts the vocabulary into blocks."""
  probs = jax.nn.softmax(jax.random.normal(jax.random.key(3), (50,)) * 2)
  n = 40_000
  sample = functools.partial(sampling.sample, block=block)
  for temperature in (1.0, 2.0):
    want = np.asarray(jax.nn.softmax(jnp.log(probs) / temperature), np.float64)
    want /= want.sum()
    logits = jnp.log(probs)[None].repeat(n, 0)
    draws = np.asarray(sample(jax.random.key(0), logits, temperature))
    counts = np.bincount(draws, minlength=50)
    assert scipy.stats.chisquare(counts, want * n).pvalue > 1e-4, temperature
    wrong = want * np.where(np.arange(50) == np.argmax(want), 1.25, 1.0)
    assert scipy.stats.chisquare(counts, wrong / wrong.sum() * n).pvalue < 1e-4
  cold = np.asarray(sample(jax.random.key(1), jnp.log(probs)[None].repeat(1000, 0), 0.01))
  assert (cold == int(np.argmax(probs))).mean() > 0.99
  # A zero-probability token is never drawn.
  masked = jnp.log(probs).at[7].set(-jnp.inf)
  assert 7 not in np.asarray(sample(jax.random.key(2), masked[None].repeat(n, 0), 1.0))


def test_disc_loss_counts():
  logits = jnp.array([[3.0, -3.0, 3.0, -3.0]])
  labels = jnp.array([[True, True, False, False]])
  loss, acc, counts = losses.disc_loss(logits, labels, jnp.ones((1, 4)))
  assert float(acc) == pytest.approx(0.5)
  assert float(counts["disc_true_positives"]) == 1 and float(counts["disc_predicted_positives"]) == 2
  expected = -np.mean(np.log(jax.nn.sigmoid(np.array([3.0, -3.0, 3.0, -3.0]) * np.array([1, 1, -1, -1]))))
  assert float(loss) == pytest.approx(expected, rel=1e-5)


def test_uniform_replacement_trains_discriminator_alone():
  """The objective added as one registry entry: no generator parameters; D's labels mark exactly the tokens that
  changed, ~mask_prob of the maskable ones (a uniform draw rarely equals the original or a special id)."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from electra_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from electra_jax.model import modeling
  c = config_lib.base("tiny")
  c.data.update(vocab_size=VOCAB, seq_len=128)
  c.objective.name = "uniform_replacement"
  model = modeling.Electra(modeling.ModelConfig.from_config(c))
  params = nn.meta.unbox(jax.jit(lambda k: objectives.init_params(model, c.objective.name, c.data.seq_len, k))(
      jax.random.key(0)))
  assert set(params) == {"embeddings", "discriminator", "discriminator_head"}
  ids = _batch(np.random.default_rng(1), batch=64)
  loss, metrics = objectives.compute_loss(model, params, {"input_ids": ids, "segment_ids": jnp.zeros_like(ids)},
                                          jax.random.key(2), objectives.ObjectiveConfig.from_config(c), SPECIAL,
                                          deterministic=True)
  non_pad = np.asarray(ids != SPECIAL.pad)
  maskable = non_pad & np.asarray((ids != SPECIAL.cls) & (ids != SPECIAL.sep))
  expected = 0.15 * maskable.sum() / non_pad.sum()
  assert abs(float(metrics["replaced_fraction"]) - expected) < 0.01
  assert float(metrics["disc_label_positives"]) == pytest.approx(float(metrics["replaced_fraction"]) * non_pad.sum())
  assert np.isfinite(float(loss)) and "mlm_loss" not in metrics
  electra = c.copy_and_resolve_references()
  electra.objective.name = "electra"
  assert flops.step_flops(c) < flops.step_flops(electra)


def test_scatter_sets_the_weighted_positions():
  """masking.scatter (selects, no scatter op) sets values where the weight is positive and keeps the rest."""
  rng = np.random.default_rng(0)
  ids = rng.integers(5, VOCAB, (64, 32)).astype(np.int32)
  positions = np.stack([rng.choice(32, 6, replace=False) for _ in range(64)]).astype(np.int32)
  values = rng.integers(5, VOCAB, (64, 6)).astype(np.int32)
  weights = (rng.random((64, 6)) < 0.7).astype(np.float32)
  expected = ids.copy()
  for r, p in zip(*np.nonzero(weights)):
    expected[r, positions[r, p]] = values[r, p]
  np.testing.assert_array_equal(masking.scatter(*map(jnp.asarray, (ids, positions, values, weights))), expected)


def test_top1_correct_is_the_first_maximum():
  """mlm_accuracy's top-1: the target must be where argmax (the first maximum) is, ties included."""
  logits = jnp.array([[1.0, 3.0, 3.0, 0.0], [2.0, 0.0, 2.0, 2.0], [0.0, 1.0, 5.0, 1.0]])
  for targets, want in (([1, 0, 2], [1, 1, 1]), ([2, 2, 1], [0, 0, 0])):
    np.testing.assert_array_equal(losses.top1_correct(logits, jnp.array(targets)), want)
    np.testing.assert_array_equal(np.argmax(logits, -1) == np.array(targets), np.array(want, bool))
