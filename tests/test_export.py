"""HF transformers export/import: numeric parity both ways on real tokenized text, tokenizer parity, loud errors."""
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax import export
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.hf import directory as hf_directory
from electra_jax.hf import tokenizer as hf_tokenizer
from electra_jax.model import modeling
from electra_jax.pretrain import experiment
from electra_jax.pretrain import loop as pretrain_loop
from electra_jax.run import weights
from electra_jax.run import workdir as workdir_lib
from tests import helpers

# The numeric reference: `make test` installs it, so a missing one must fail, not skip.
import torch  # pylint: disable=g-import-not-at-top,wrong-import-position
import transformers  # pylint: disable=g-import-not-at-top,wrong-import-position
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOL = 1e-5


def _sentences(n):
  return helpers.sotu_sentences()[:n]


def _batch(tok, sentences, seq_len):
  """[CLS] A [SEP] B [SEP] pairs of consecutive real sentences, 0-padded: ids, segment ids."""
  s = tok.special_ids
  ids = np.zeros((len(sentences) // 2, seq_len), np.int32)
  seg = np.zeros_like(ids)
  for row, (a, b) in enumerate(zip(sentences[::2], sentences[1::2])):
    a, b = tok.encode(a)[:seq_len // 2 - 2], tok.encode(b)[:seq_len // 2 - 1]
    x = [s.cls] + a + [s.sep] + b + [s.sep]
    ids[row, :len(x)] = x
    seg[row, len(a) + 2:len(x)] = 1
  return ids, seg


def _ours(config, params, ids, seg):
  model = modeling.Electra(modeling.ModelConfig.from_config(config))
  v = {"params": params}
  positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
  return (np.asarray(model.apply(v, ids, seg, method=model.discriminator_logits)),
          np.asarray(model.apply(v, ids, seg, positions, method=model.generator_logits)),
          np.asarray(model.apply(v, ids, seg, method=model.encode)))


def _theirs(out_dir, ids, seg):
  kw = dict(input_ids=torch.tensor(ids, dtype=torch.long), token_type_ids=torch.tensor(seg, dtype=torch.long),
            attention_mask=torch.tensor(ids != 0, dtype=torch.long))
  outs = []
  for cls, path in ((transformers.ElectraForPreTraining, out_dir),
                    (transformers.ElectraForMaskedLM, os.path.join(out_dir, "generator")),
                    (transformers.ElectraModel, out_dir)):
    if not os.path.isdir(path):  # no generator: compared on the discriminator alone
      outs.append(None)
      continue
    model, info = cls.from_pretrained(path, output_loading_info=True)
    # No missing or mismatched weights; the bare encoder leaves only the discriminator head unused.
    head = {k for k in info["unexpected_keys"] if k.startswith("discriminator_predictions.")}
    assert not any(info.values()) or (cls is transformers.ElectraModel and head == info.pop("unexpected_keys")
                                      and not any(info.values())), (cls.__name__, info)
    with torch.no_grad():
      out = model.eval()(**kw)
    outs.append((out.last_hidden_state if cls is transformers.ElectraModel else out.logits).numpy())
  return outs


def _assert_parity(ours, theirs, ids):
  real = ids != 0
  for name, a, b in zip(("discriminator", "generator", "hidden"), ours, theirs):
    if b is None:
      continue
    err = np.abs(a - b)[real].max()
    assert err <= TOL, f"{name} logits differ by {err}"


@pytest.mark.parametrize("sharing", ["shared", "gdes", "untied", "all"])
def test_export_parity(sharing, tiny_data, tmp_path):
  config = helpers.tiny_config(tiny_data, sharing, num_layers=2)
  params = helpers.random_params(config)
  hf_directory.export(config, params, str(tmp_path / "hf"))
  assert sorted(os.listdir(tmp_path)) == ["hf"]  # the temporary directory was renamed, not left behind
  tok = tokenizer_lib.Tokenizer(tiny_data[1].tokenizer_path)
  ids, seg = _batch(tok, _sentences(16), config.data.seq_len)
  _assert_parity(_ours(config, params, ids, seg), _theirs(str(tmp_path / "hf"), ids, seg), ids)
  if sharing == "shared":  # our own export imports back bit-exactly
    config2, params2, _ = weights.load(str(tmp_path / "hf"))
    assert config2.objective.embedding_sharing == "shared"
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(params), params2)


def _tokenizer_mismatches(model_path, out_dir, lines):
  """Indices of the lines (and of the consecutive pairs) where AutoTokenizer on our export differs from our ids."""
  hf_tokenizer.save_tokenizer(model_path, str(out_dir), 512)
  hf = transformers.AutoTokenizer.from_pretrained(str(out_dir))
  tok = tokenizer_lib.Tokenizer(model_path)
  s = tok.special_ids
  ours = tok.encode_batch(lines)
  bad = [i for i, (g, e) in enumerate(zip(hf(lines)["input_ids"], ours)) if g != [s.cls] + e + [s.sep]]
  enc = hf(lines[0::2][:len(lines) // 2], lines[1::2])
  for i, (ids, types) in enumerate(zip(enc["input_ids"], enc["token_type_ids"])):
    ea, eb = ours[2 * i], ours[2 * i + 1]
    if ids != [s.cls] + ea + [s.sep] + eb + [s.sep] or types != [0] * (len(ea) + 2) + [1] * (len(eb) + 1):
      bad.append(("pair", i))
  return bad


def test_hf_tokenizer_matches_ours(tiny_data, tmp_path):
  """Every paragraph of the speeches (26k lines, 3.7M tokens), alone and in pairs, token types included.

  Without train_sentencepiece's 1/64 score grid, float32 (SentencePiece) and float64 (HF) sums of tied
  segmentations split 16 of these lines differently."""
  lines = helpers.sotu_lines()
  assert len(lines) > 20000
  assert _tokenizer_mismatches(tiny_data[1].tokenizer_path, tmp_path / "hf", lines) == []


def _random_hf(cls, config, seed):
  torch.manual_seed(seed)
  model = cls(config).eval()
  with torch.no_grad():  # LayerNorms start at 1/0 and biases at 0: perturb everything so parity means something
    for p in model.parameters():
      p.add_(0.05 * torch.randn_like(p))
  return model


@pytest.mark.parametrize("generator", ["shared", "untied", "none"])
def test_import_hf_parity(generator, tmp_path):
  """A randomly built HF ELECTRA (WordPiece vocab, generator beside it or none) imported into ours gives the same
  logits, as a full pre-training state (a missing generator initialised as ours are)."""
  hf_dir = tmp_path / "electra-hf"
  hf_dir.mkdir()
  vocab_size = helpers.wordpiece_vocab(hf_dir / "vocab.txt")
  size = dict(vocab_size=vocab_size, embedding_size=32, num_hidden_layers=2, intermediate_size=128,
              max_position_embeddings=128, hidden_act="gelu")
  disc = _random_hf(transformers.ElectraForPreTraining,
                    transformers.ElectraConfig(hidden_size=64, num_attention_heads=2, **size), 0)
  disc.save_pretrained(hf_dir)
  if generator != "none":
    gen = _random_hf(transformers.ElectraForMaskedLM, transformers.ElectraConfig(
        hidden_size=32, num_attention_heads=1, **dict(size, intermediate_size=64)), 1)
    if generator == "shared":
      gen.electra.embeddings.load_state_dict(disc.electra.embeddings.state_dict())
    gen.save_pretrained(hf_dir / "generator")

  config, params, _ = weights.load(str(hf_dir))
  assert config.objective.embedding_sharing == ("untied" if generator == "untied" else "shared")
  tok = tokenizer_lib.Tokenizer(config.data.tokenizer)
  ids, seg = _batch(tok, _sentences(16), 64)
  assert (ids == 1).mean() < 0.05  # real words, not [UNK]
  _assert_parity(_ours(config, params, ids, seg), _theirs(str(hf_dir), ids, seg), ids)
  # The imported params are a full pre-training state: experiment.create(config) accepts them as they are.
  shapes = jax.eval_shape(experiment.create(config).sharded.init, jax.random.key(0)).params
  assert jax.tree.structure(shapes) == jax.tree.structure(params)
  assert jax.tree.map(lambda a: a.shape, shapes) == jax.tree.map(lambda a: a.shape, params)


def _cli(*args):
  return subprocess.run([sys.executable, "-m", "electra_jax.export", *args], cwd=ROOT, capture_output=True,
                        text=True, env=dict(os.environ, PYTHONPATH=ROOT), timeout=300)


@pytest.mark.slow
def test_cli_exports_a_workdir_and_refuses_to_overwrite(tiny_data, tmp_path):
  config = helpers.tiny_config(tiny_data, "shared", num_layers=2)
  params = helpers.save_workdir(config, str(tmp_path / "run"), step=7)
  out = tmp_path / "export"
  r = _cli(f"--workdir={tmp_path / 'run'}", f"--output={out}")
  assert r.returncode == 0, r.stderr[-3000:]
  assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "sentencepiece.model",
          "generator"} <= set(os.listdir(out))
  tok = tokenizer_lib.Tokenizer(tiny_data[1].tokenizer_path)
  ids, seg = _batch(tok, _sentences(8), 64)
  _assert_parity(_ours(config, params, ids, seg), _theirs(str(out), ids, seg), ids)

  before = sorted(os.listdir(out))
  r = _cli(f"--workdir={tmp_path / 'run'}", f"--output={out}")
  helpers.assert_one_line_error(r, "export exists; pass --overwrite")
  assert sorted(os.listdir(out)) == before

  a_file = out / "config.json"  # an --output that is a file, or lies under one, is named as such (not "[Errno 17]")
  for output in (a_file, a_file / "export"):
    with pytest.raises(NotADirectoryError, match=f"^--output {output} cannot be created: {a_file} is a file$"):
      export.main(str(tmp_path / "run"), str(output), None, True)
  assert sorted(os.listdir(out)) == before


@pytest.mark.slow
def test_errors_are_one_line(tiny_data, tmp_path):
  (tmp_path / "empty").mkdir()
  config = helpers.tiny_config(tiny_data, "shared")
  workdir_lib.write_config(str(tmp_path / "empty"), config)
  missing = f"no checkpoint under {tmp_path / 'empty'}/checkpoints"
  with pytest.raises(FileNotFoundError, match=missing):
    weights.load(str(tmp_path / "empty"))
  r = _cli(f"--workdir={tmp_path / 'empty'}", f"--output={tmp_path / 'out'}")
  helpers.assert_one_line_error(r, missing)
  assert not (tmp_path / "out").exists()

  tok = tiny_data[1].tokenizer_path
  config.data.vocab_size = 1999
  with pytest.raises(ValueError, match="has 2000 tokens but the model's vocabulary has 1999"):
    hf_directory.export(config, helpers.random_params(config), str(tmp_path / "out"), tokenizer_path=tok)
  assert not (tmp_path / "out").exists()


@pytest.mark.slow  # two pre-training runs
def test_pretraining_continues_from_an_export(tiny_data, tmp_path):
  """train.init_from starts a run from an HF directory's weights (here with lr 0, so they must come back unchanged);
  weights that do not fit the config are refused before anything is written."""
  config = helpers.tiny_config(tiny_data, "shared", num_layers=2)
  params = helpers.random_params(config)
  hf_directory.export(config, params, str(tmp_path / "hf"))
  config.train.update(init_from=str(tmp_path / "hf"), learning_rate=0.0, num_steps=1, eval_every=1)
  pretrain_loop.train_and_evaluate(config, str(tmp_path / "run"))
  restored = weights.load(str(tmp_path / "run")).params
  jax.tree.map(np.testing.assert_array_equal, restored, params)

  # Google's releases keep the generator in a directory of its own: train.init_from_generator names it.
  shutil.move(str(tmp_path / "hf" / "generator"), str(tmp_path / "generator"))
  config.train.init_from_generator = str(tmp_path / "generator")
  pretrain_loop.train_and_evaluate(config, str(tmp_path / "run_apart"))
  jax.tree.map(np.testing.assert_array_equal, weights.load(str(tmp_path / "run_apart")).params, params)
  config.train.init_from_generator = ""

  config.model.intermediate_size *= 2
  wider = r"does not fit this config at discriminator\.layer_0\.intermediate\.bias: \(128"
  with pytest.raises(ValueError, match=wider):
    pretrain_loop.train_and_evaluate(config, str(tmp_path / "wider"))
  assert not (tmp_path / "wider").exists()


@pytest.mark.slow
def test_pretraining_continues_from_a_workdir_of_another_mesh(tiny_data, tmp_path):
  """train.init_from restores a workdir's weights onto this run's mesh, and export and fine-tuning read them, whichever
  mesh they were trained on (here one of 3 data-parallel devices, which this host cannot build)."""
  config = helpers.tiny_config(tiny_data, "shared", num_layers=2)
  source = str(tmp_path / "source")
  params = helpers.save_workdir(config, source)
  saved = workdir_lib.load_config(source)
  saved.mesh.data = 3
  workdir_lib.write_config(source, saved)
  jax.tree.map(np.testing.assert_array_equal, weights.load(source).params, params)
  config.train.update(init_from=source, learning_rate=0.0, num_steps=1, eval_every=1)
  pretrain_loop.train_and_evaluate(config, str(tmp_path / "run"))
  jax.tree.map(np.testing.assert_array_equal, weights.load(str(tmp_path / "run")).params, params)
