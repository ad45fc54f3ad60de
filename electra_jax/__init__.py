"""ELECTRA pre-training in JAX/Flax.

The folders are layers; a module imports only from its own layer or the ones below it, and electra-prepare with
data/ reaches no model or Flax (import-linter's contracts in .importlinter, which tests/test_layers.py runs):

  bench, compile                  commands that build on the two below
  pretrain/, finetune/            the two training commands, independent of each other
  prepare, export, check          the other commands; cli.py: what every command shares
  run/                            what a run owns: the loop, checkpoints, workdir, metrics, goodput, weights' sources
  hf/                             HF transformers interchange
  parallel/                       the mesh and shardings, the train state and its update, ahead-of-time compiling
  model/                          the method: the encoders, masking, sampling, losses, objectives, FLOPs
  data/                           tokenizers, corpora, prepared datasets and the input pipeline
  config.py                       the config schema
  runtime/                        the process: storage (local and gs://), JAX's set-up, optional packages, console
"""
