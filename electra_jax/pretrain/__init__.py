"""Pre-training ELECTRA's generator and discriminator (`electra-pretrain`); the twin of finetune/, the same file for
the same role. May import cli, run/ and the layers below; never finetune/. Nothing is imported here, so that the
command checks its flags and packages before it imports the model stack.

  plan.py           what a run is, decided once at its entrance (data, tokenizer, resume or start, config changes)
  experiment.py     what a config compiles: model, optimiser, the jitted train and eval steps, the evaluation
  loop.py           restore or init, batches, logging with throughput, evaluation (around run/loop.py)
"""
