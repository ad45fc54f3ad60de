"""Pre-training ELECTRA's generator and discriminator (`electra-pretrain`, or `python -m electra_jax.pretrain`); the
twin of finetune/, with the same file for the same role. May import cli, run/ and the layers below; never
finetune/.

  plan.py           what a run is, decided once at its entrance: the prepared data and tokenizer, resume or start
                    (from which weights: a sources.Source), what changed since the workdir's config.json
  experiment.py     what a config compiles: the model, the optimiser, the pure train_step and eval step, jitted over
                    the mesh (sharding.py), and the held-out evaluation
  loop.py           the loop's own part: restore or init as the plan says (the input position included),
                    batches from the input pipeline, logging with throughput, evaluation (the shared loop is
                    electra_jax/run/loop.py)
  __main__.py       the command line

Nothing is imported here, so that the command checks its flags and packages before it imports the model stack.
"""
