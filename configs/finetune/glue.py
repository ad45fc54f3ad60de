"""GLUE through TFDS with the official ELECTRA fine-tuning recipe; the argument is `TASK` or `TASK,SIZE`.

  electra-finetune --config=configs/finetune/glue.py:sst2 --config.init_from=runs/small --workdir=runs/glue/sst2
  electra-finetune --config=configs/finetune/glue.py:rte,base --config.init_from=exports/base \
      --config.task.tfds_data_dir=/data/tfds --workdir=runs/glue/rte

TASK: cola | sst2 | mrpc | stsb | qqp | mnli | qnli | rte. SIZE (small by default) is the pre-trained model's, and
picks the learning rate and layer-wise decay: small 3e-4 / 0.8, base 1e-4 / 0.8, large 5e-5 / 0.9 (Clark et al.
2020, Table 7). The rest is google-research/electra configure_finetuning.py's: batch 32, sequence length 128,
warm-up 10%, 3 epochs (10 for RTE and STS-B) and no more, every training row, the last model (train.min_steps=0,
task.dev_fraction=0; the protocol's --learning_rates needs --config.task.dev_fraction=0.1 to choose). The data is read
from a TFDS data_dir prepared beforehand, never downloaded (docs/glue.md). Not reproduced: the official code also
trains MRPC, QQP and STS-B on both sentence orders.
"""
from electra_jax import finetune

# TFDS fields (text, text_b), metric, epochs, evaluation and test splits (MNLI: the matched ones).
TASKS = {
    "cola": ("sentence", "", "mcc", 3.0, "validation", "test"),
    "sst2": ("sentence", "", "accuracy", 3.0, "validation", "test"),
    "mrpc": ("sentence1", "sentence2", "f1", 3.0, "validation", "test"),
    "stsb": ("sentence1", "sentence2", "pearson", 10.0, "validation", "test"),  # regression; Spearman reported too
    "qqp": ("question1", "question2", "f1", 3.0, "validation", "test"),
    "mnli": ("premise", "hypothesis", "accuracy", 3.0, "validation_matched", "test_matched"),
    "qnli": ("question", "sentence", "accuracy", 3.0, "validation", "test"),
    "rte": ("sentence1", "sentence2", "accuracy", 10.0, "validation", "test"),
}
RECIPES = {"small": (3e-4, 0.8), "base": (1e-4, 0.8), "large": (5e-5, 0.9)}


def get_config(arg: str = "sst2"):
  name, size = (arg.split(",") + ["small"])[:2]
  if name not in TASKS or size not in RECIPES:
    raise ValueError(f"configs/finetune/glue.py:{arg}: expected TASK[,SIZE], TASK one of {', '.join(TASKS)}, "
                     f"SIZE one of {', '.join(RECIPES)}")
  text, text_b, metric, epochs, eval_split, test_split = TASKS[name]
  c = finetune.base_config()
  c.task.update(name=name, tfds_name=f"glue/{name}", train_split="train", eval_split=eval_split,
                test_split=test_split, text_field=text, text_b_field=text_b, label_field="label",
                type="regression" if name == "stsb" else "classification", metric=metric, num_epochs=epochs,
                dev_fraction=0.0)
  c.seq_len = 128
  lr, decay = RECIPES[size]
  c.train.update(batch_size=32, learning_rate=lr, layer_decay=decay, warmup_fraction=0.1, min_steps=0, patience=0)
  c.mesh.update(data=1, fsdp=-1)  # the weights and optimiser state split over the slice (config.py's mesh)
  return c
