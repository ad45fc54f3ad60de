"""The pre-training recipe study: short runs of the demo's model and data, one per recipe, compared by how fast the
discriminator learns (held-out ROC AUC, replaced-token recall) and the generator's MLM accuracy.

  python studies/pretrain_study.py --config=configs/studies/pretrain_study.py              # run (resumes), report
  python studies/pretrain_study.py --config=configs/studies/pretrain_study.py --config.recipes=lr1e-3,lr3e-4
  python studies/pretrain_study.py --config=configs/studies/pretrain_study.py --time_only  # quiet step times only

Every recipe is BASELINE plus its overrides, and runs the same number of steps; minutes are steps times the
recipe's step time, measured alone (--time_only, or before each run), so runs that shared the machine compare fairly.
"""
import ml_collections

from configs import demo

# An earlier demo recipe without dropout: ELECTRA-Small's optimiser (β2 0.999, BERT's initializer range 0.02) at the
# demo's size, lr 1e-3 with a 200-step warm-up. Every recipe below changes it in the keys it names.
BASELINE = dict(model=dict(dropout_rate=0.0, attention_dropout_rate=0.0, initializer_range=0.02),
                train=dict(learning_rate=1e-3, warmup_steps=200, adam_b2=0.999),
                objective=dict(mask_prob=0.15, embedding_sharing="shared", disc_weight=50.0, temperature=1.0))

# name -> (what changes, overrides on top of BASELINE).
RECIPES = {
    "uniform": ("diagnostic: near-uniform replacements (temperature 1000), 500 steps",
                dict(objective=dict(temperature=1000.0), train=dict(num_steps=500))),
    "lr1e-3": ("baseline: lr 1e-3", {}),
    "lr1e-3_init0.08": ("lr 1e-3, initializer range 0.08 (≈ 1/√hidden)", dict(model=dict(initializer_range=0.08))),
    "lr1e-3_init0.08_heads4": ("as lr1e-3_init0.08, 4 heads", dict(model=dict(initializer_range=0.08, num_heads=4))),
    "lr1e-3_init0.08_seq64": ("as lr1e-3_init0.08, 64 × 64 tokens a batch",
                              dict(model=dict(initializer_range=0.08), data=dict(seq_len=64),
                                   train=dict(batch_size=64))),
    "lr1e-3_tied_l50": ("lr 1e-3, G = D with every weight tied, λ 50",
                        dict(model=dict(generator_fraction=1.0), objective=dict(embedding_sharing="all"))),
    "lr1e-3_tied_l1": ("lr 1e-3, G = D with every weight tied, λ 1",
                       dict(model=dict(generator_fraction=1.0),
                            objective=dict(embedding_sharing="all", disc_weight=1.0))),
    "lr3e-3_init0.08": ("lr 3e-3 (warm-up 300), initializer range 0.08",
                        dict(model=dict(initializer_range=0.08), train=dict(learning_rate=3e-3, warmup_steps=300))),
    "lr5e-4": ("lr 5e-4 (ELECTRA-Small's)", dict(train=dict(learning_rate=5e-4))),
    "lr3e-4": ("lr 3e-4", dict(train=dict(learning_rate=3e-4))),
    "lr3e-4_init0.08": ("lr 3e-4, initializer range 0.08",
                        dict(model=dict(initializer_range=0.08), train=dict(learning_rate=3e-4))),
    "lr3e-4_b2_0.98": ("lr 3e-4, Adam β2 0.98", dict(train=dict(learning_rate=3e-4, adam_b2=0.98))),
    "lr3e-4_warmup1000": ("lr 3e-4, warm-up 1000", dict(train=dict(learning_rate=3e-4, warmup_steps=1000))),
    "lr1.5e-4": ("lr 1.5e-4", dict(train=dict(learning_rate=1.5e-4))),
    "lr1e-4_init0.08": ("lr 1e-4, initializer range 0.08",
                        dict(model=dict(initializer_range=0.08), train=dict(learning_rate=1e-4))),
}


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.base = demo.get_config()
  c.base.train.update(eval_every=200, eval_batches=8, log_every=50, checkpoint_every=200, keep_checkpoints=1)
  c.recipes = ",".join(RECIPES)  # comma-separated subset of RECIPES, run in this order
  c.num_steps = 3000  # per recipe (unless it sets train.num_steps); also its learning-rate schedule's length
  c.target_auc = 0.8
  c.workdir = "runs/pretrain_study"
  c.output = "docs/pretraining/study.md"  # generated; the figure goes beside it (docs/pretraining.md discusses it)
  c.lock()
  return c
