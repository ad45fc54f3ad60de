"""ELECTRA pre-training in JAX/Flax.

The folders are layers; a module imports only from its own layer or the ones below it (tests/test_layers.py checks
this with import-linter's contracts in .importlinter):

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
