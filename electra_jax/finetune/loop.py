"""The fine-tuning loop: the workdir's checks, restore or init, the jitted step (state.py), evaluation and model
selection, the best model and its predictions, metrics, checkpoints and preemption.

The batch of step i is a pure function of (train.seed, i) (one seeded permutation per epoch) and the dropout rng is
folded with the step, so a run resumed from a checkpoint ends as an uninterrupted one does.
"""
import dataclasses
import functools
import json
import math
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from etils import epath

from electra_jax import checkpoints, closing, modeling, preemption, sharding, state as state_lib, storage, weights
from electra_jax import metrics as metrics_lib
from electra_jax import tokenizer as tokenizer_lib
from electra_jax import workdir as workdir_lib
from electra_jax.finetune import hf_classifier, model as model_lib, tasks

BEST_DIR = "best"
RESULTS_FILE = "eval_results.json"


def _loss(logits, labels, regression: bool):
  if regression:
    return jnp.mean((logits[:, 0] - labels) ** 2)
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def train_step(state: state_lib.TrainState, batch, rng, *, model, tx, regression):
  def loss_fn(params):
    logits = model.apply({"params": params}, batch["input_ids"], batch["segment_ids"], deterministic=False,
                         rngs={"dropout": jax.random.fold_in(rng, state.step)})
    return _loss(logits, batch["labels"], regression)

  loss, grads = jax.value_and_grad(loss_fn)(state.params)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  new_state = state_lib.TrainState(state.step + 1, optax.apply_updates(state.params, updates), opt_state)
  return new_state, dict(loss=loss, grad_norm=optax.global_norm(grads))


@functools.lru_cache(maxsize=1)
def _permutation(seed: int, epoch: int, n: int) -> np.ndarray:
  return np.random.default_rng([seed, epoch]).permutation(n)


def batch_rows(step: int, seed: int, n: int, batch_size: int) -> np.ndarray:
  """The training rows of 0-based step `step`: epoch e's seeded permutation of the n rows, cut into batches (the
  incomplete last batch of an epoch is dropped)."""
  epoch, i = divmod(step, n // batch_size)
  return _permutation(seed, epoch, n)[i * batch_size:(i + 1) * batch_size]


def _to_global(examples: tasks.Examples, index: np.ndarray, batch_sharding):
  """The global batch of rows `index`, from this host's share of them."""
  n = len(index) // jax.process_count()
  local = index[jax.process_index() * n:(jax.process_index() + 1) * n]
  return {k: jax.make_array_from_process_local_data(batch_sharding, getattr(examples, k)[local])
          for k in ("input_ids", "segment_ids", "labels")}


def _check_workdir(workdir: str, ft: ml_collections.ConfigDict) -> bool:
  """True when the workdir must be emptied first (it holds another run and ft.overwrite); a run of the same config
  is resumed (log, evaluation and checkpoint cadence and the mesh may change); anything else is refused."""
  path = epath.Path(workdir)
  if not path.exists() or not any(p.name != workdir_lib.LOCK_FILE for p in path.iterdir()):
    return False
  what = f"holds files but no {path / 'config.json'}"
  if (path / "config.json").exists():
    changes = [c for c in workdir_lib.config_changes(json.loads((path / "config.json").read_text()),
                                                     json.loads(ft.to_json_best_effort()))
               if not c.startswith("overwrite:")]
    if not changes:
      return False
    what = f"holds another run (its config.json differs: {'; '.join(changes)})"
  if not ft.overwrite:
    raise FileExistsError(f"workdir {workdir} {what}; pass --config.overwrite=true to replace it")
  return True


def _check_loop_config(ft: ml_collections.ConfigDict):
  for key in ("log_every", "checkpoint_every", "keep_checkpoints", "batch_size", "eval_batch_size"):
    if ft.train[key] < 1:
      raise ValueError(f"train.{key}={ft.train[key]} must be at least 1")
  if ft.train.eval_every < 0:
    raise ValueError(f"train.eval_every={ft.train.eval_every} must be 0 (per epoch or at the end) or positive")


def _check_finite(step: int, loss: float, grad_norm: float, ckpt: checkpoints.Checkpointer):
  if not (math.isfinite(loss) and math.isfinite(grad_norm)):
    kept = ckpt.latest_step() if ckpt.last_saved is None else ckpt.last_saved
    raise FloatingPointError(f"loss={loss} grad_norm={grad_norm} at step {step}: stopped without saving it" +
                             (f"; the last good checkpoint is kept (step {kept} under {ckpt.directory})"
                              if kept else ""))


def finetune(ft: ml_collections.ConfigDict, workdir: str) -> dict | None:
  """Fine-tunes per `ft` in `workdir`, resuming from its latest checkpoint; returns the results (also written to
  eval_results.json, last), or None when stopped by SIGTERM/SIGINT (after saving: run it again to resume). Raises a
  one-line ValueError/OSError on bad input before anything is written, FloatingPointError on a NaN/Inf loss."""
  t0 = time.time()
  _check_loop_config(ft)
  storage.refuse_overlap(workdir, _inputs(ft), "--workdir")
  with workdir_lib.Lock(workdir, "electra-finetune") as lock:
    return _finetune(ft, workdir, lock, t0)


def _inputs(ft: ml_collections.ConfigDict) -> list[tuple[str, str]]:
  """What a run reads, which its workdir (replaced with overwrite) must keep apart from."""
  task = ft.task
  paths = weights.inputs(ft.init_from) if ft.init_from else []
  paths += [(ft.tokenizer, "config.tokenizer")] if ft.tokenizer else []
  paths += [(task[k], f"task.{k}") for k in ("train_file", "eval_file", "test_file") if task[k]]
  return paths + ([(task.tfds_data_dir, "task.tfds_data_dir")] if task.tfds_name and task.tfds_data_dir else [])


def _finetune(ft: ml_collections.ConfigDict, workdir: str, lock: workdir_lib.Lock, t0: float) -> dict | None:
  replace = _check_workdir(workdir, ft)
  src_config, src_params, tokenizer_path = model_lib.load_source(ft)
  tok = tokenizer_lib.Tokenizer(tokenizer_path)
  if tok.vocab_size != src_config.data.vocab_size:
    raise ValueError(f"tokenizer {tokenizer_path} has {tok.vocab_size} tokens but the model's vocabulary has "
                     f"{src_config.data.vocab_size}")
  seq_len = min(ft.seq_len, src_config.model.max_position_embeddings)
  train_ex, eval_ex, test_ex, names = tasks.make_examples(ft.task, tok, seq_len)
  rest, dev = tasks.carve(len(train_ex.labels), ft.task.dev_fraction, ft.task.num_train_examples, ft.task.split_seed)
  train_ex, dev_ex = train_ex.take(rest), train_ex.take(dev) if len(dev) else None
  regression = names is None
  metric = tasks.selection_metric(ft.task, regression)
  num_labels = 1 if regression else len(names)

  # The discriminator alone, in the shared layout, with the fine-tuning dropout.
  mc = dataclasses.replace(modeling.ModelConfig.from_config(src_config), embedding_sharing="shared",
                           dropout_rate=ft.train.dropout_rate, attention_dropout_rate=ft.train.dropout_rate)
  model = model_lib.Classifier(mc, num_labels)
  bs, seed = ft.train.batch_size, ft.train.seed
  steps_per_epoch = len(train_ex.labels) // bs
  if not steps_per_epoch:
    raise ValueError(f"{len(train_ex.labels)} training examples do not fill one batch of {bs}")
  num_steps = max(1, math.ceil(ft.task.num_epochs * steps_per_epoch))
  eval_every = ft.train.eval_every or (steps_per_epoch if dev_ex is not None else num_steps)
  tx, schedule = model_lib.optimizer(ft.train, num_steps, mc.discriminator.num_layers)

  mesh = sharding.create_mesh(ft.mesh)
  sharding.check_batch(bs, mesh)
  sharding.check_batch(ft.train.eval_batch_size, mesh)
  dummy = jnp.zeros((1, seq_len), jnp.int32)
  sharded = state_lib.create(lambda rng: model.init(rng, dummy, dummy)["params"], tx, mesh)
  step_fn = sharded.jit_step(functools.partial(train_step, model=model, tx=tx, regression=regression))
  predict = sharded.jit_eval(lambda p, b, rng: model.apply({"params": p}, b["input_ids"], b["segment_ids"]))
  rng = jax.random.fold_in(jax.random.key(seed), 1)

  def logits_of(params, examples: tasks.Examples) -> np.ndarray:
    """Every example once: the last batch is padded with copies of row 0, whose outputs are dropped."""
    n, ebs = len(examples.labels), ft.train.eval_batch_size
    out = [predict(params, _to_global(examples, np.arange(start, start + ebs) % n, sharded.batch), rng)
           for start in range(0, n, ebs)]
    return np.concatenate(sharding.to_host(out))[:n]  # every host's rows, gathered

  # Every check passed: only now is anything written or deleted.
  if replace:
    logging.warning("Replacing %s (--config.overwrite)", workdir)
    for p in epath.Path(workdir).iterdir():
      if p.name != workdir_lib.LOCK_FILE:  # ours, held until the run ends
        p.rmtree() if p.is_dir() else p.unlink()
  ckpt = checkpoints.Checkpointer(workdir, ft, tokenizer_path)
  if ckpt.latest_step() is None:
    state = sharded.init(jax.random.key(seed))
    if src_params is not None:
      loaded = jax.device_get(model_lib.encoder_params(src_config, src_params))
      if jax.tree.map(np.shape, loaded) != jax.tree.map(lambda x: x.shape, state.params["electra"]):
        raise ValueError(f"{ft.init_from}: the checkpoint's encoder does not match its config")
      state = state.replace(params=dict(state.params,
                                        electra=jax.device_put(loaded, sharded.state.params["electra"])))
    progress = dict(history=[], best=None, losses=[], seconds=0.0)  # what the loop carries across a resume
  else:
    restored = ckpt.restore(sharded.abstract(), set_aside_corrupt=True)
    state, progress = restored.state, restored.data_state
    logging.info("Resumed %s from step %d", workdir, int(state.step))
  start, seconds_before = int(state.step), progress["seconds"]
  seconds = lambda: round(seconds_before + time.time() - t0, 1)  # this run's, over every session up to its save
  workdir_lib.write_config(workdir, ft)
  writer = metrics_lib.Writer(workdir, start)

  def save_best(record: dict, eval_logits: np.ndarray):
    """best/ and the predictions of the model `record` evaluated."""
    progress["best"] = record
    hf_classifier.save(mc, sharding.to_host(state.params), names, tokenizer_path, tok.special_ids.pad,
                       f"{workdir}/{BEST_DIR}")  # every process takes part in the gather; process 0 writes
    outputs = [("eval", eval_logits)] + ([("test", logits_of(state.params, test_ex))] if test_ex else [])
    for split, logits in outputs:
      if jax.process_index() == 0:
        rows = tasks.prediction_rows(logits, names)
        storage.write(epath.Path(workdir) / f"predictions_{split}.jsonl", "".join(json.dumps(r) + "\n" for r in rows))

  def evaluate(step: int):
    eval_logits = logits_of(state.params, eval_ex)
    record = dict(step=step, eval=tasks.compute_metrics(eval_ex.labels, eval_logits, num_labels))
    if dev_ex is not None:
      record["dev"] = tasks.compute_metrics(dev_ex.labels, logits_of(state.params, dev_ex), num_labels)
    progress["history"].append(record)
    writer.write(step, {f"{split}_{k}": v for split in ("dev", "eval") for k, v in record.get(split, {}).items()})
    score = lambda r: float(np.nan_to_num(r["dev"][metric], nan=-1.0))
    if (step == num_steps if dev_ex is None else progress["best"] is None or score(record) > score(progress["best"])):
      save_best(record, eval_logits)
    logging.info("step %d: %s", step, {k: record[k] for k in ("dev", "eval") if k in record})

  pending = []  # (step, metrics on device) not fetched yet: fetching every step would stall the device

  def fetch(keep: int = 0) -> list[float]:
    """The losses of the pending steps but the last `keep`, after checking that they and their gradients are
    finite."""
    done, pending[:] = pending[:len(pending) - keep], pending[len(pending) - keep:]
    values = jax.device_get([(m["loss"], m["grad_norm"]) for _, m in done])
    for (step, _), (loss, grad_norm) in zip(done, values):
      _check_finite(step, float(loss), float(grad_norm), ckpt)
    losses = [float(loss) for loss, _ in values]
    progress["losses"] = (progress["losses"] + losses)[-steps_per_epoch:]
    return losses

  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  logging.info("Fine-tuning %d steps (%d examples, %d labels)", num_steps, len(train_ex.labels), num_labels)
  bar = tqdm(total=num_steps, initial=start, desc="fine-tuning", unit="step", dynamic_ncols=True,
             disable=jax.process_index() != 0)
  logged = []
  with preemption.Watcher() as watcher:
    try:
      for step in range(start + 1, num_steps + 1):
        batch = _to_global(train_ex, batch_rows(step - 1, seed, len(train_ex.labels), bs), sharded.batch)
        state, step_metrics = step_fn(state, batch, rng)
        pending.append((step, step_metrics))
        bar.update()
        stop = watcher.reached(step)
        eval_now = step % eval_every == 0 or step == num_steps
        save_now = stop or step == num_steps or ckpt.should_save(step)
        # At most two steps in flight (the host runs ahead of the device by one), and every loss checked before
        # the state is logged, evaluated or saved.
        logged += fetch(keep=0 if step % ft.train.log_every == 0 or eval_now or save_now else 1)
        if step % ft.train.log_every == 0 or step == num_steps:
          writer.write(step, dict(loss=np.mean(logged), learning_rate=schedule(step - 1),
                                  grad_norm=step_metrics["grad_norm"], elapsed_s=time.time() - t0))
          bar.set_postfix(loss=f"{np.mean(logged):.4f}")
          logged = []
        if eval_now:
          evaluate(step)
        if save_now:
          progress["seconds"] = seconds()
          lock.check()  # never over another writer's checkpoints
          ckpt.save(step, state, progress, force=True, rng=rng)
        if stop:
          logging.warning("Stopped by %s after step %d, saved to %s: run the same command to resume",
                          watcher.signal or "a preemption notice", step, ckpt.directory)
          return None
    finally:
      closing.close_all((bar.close, writer.close, ckpt.close))

  best = progress["best"]
  results = dict(task=ft.task.name or ft.task.tfds_name or ft.task.train_file,
                 init_from=f"random init ({ft.init_from})" if ft.random_init else ft.init_from or "random",
                 num_train=len(train_ex.labels), num_eval=len(eval_ex.labels), num_steps=num_steps,
                 steps_per_epoch=steps_per_epoch, seed=seed, train_loss=float(np.mean(progress["losses"])),
                 labels=names, metric=metric, seconds=seconds())
  results.update(best["eval"])
  if dev_ex is not None:  # model selection on the dev fold, never on the eval split
    results.update(selected_step=best["step"], dev=best["dev"], history=progress["history"])
  if jax.process_index() == 0:
    storage.write(epath.Path(workdir) / RESULTS_FILE, json.dumps(results, indent=2))
  return results
