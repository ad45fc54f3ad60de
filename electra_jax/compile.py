"""electra-compile: compile a config's train and evaluation steps for a Cloud TPU slice or NVIDIA GPUs on this machine
(no TPU or GPU needed), with XLA's TPU (the `tpu` extra) or GPU compiler (`gpu-compile`): whether they fit, what XLA
counts, the TPU cost model's estimates and each step's kernels. A step that does not fit ends in one line naming its
need and the largest batch that fits. The last line of output is one JSON object (docs/tpu.md, docs/gpu_compile.md).

  electra-compile --config=configs/base.py --tpu=v3-8
  electra-compile --config=configs/finetune/glue.py:mnli,base --tpu=v3-8 --encoder=base
  electra-compile --config=configs/finetune/qa.py --config.seq_len=512 --tpu=v3-8 --config.init_from=gs://B/export
  electra-compile --config=configs/small.py --gpu=h200
"""
import json
import time
from importlib import metadata

from absl import flags
from ml_collections import config_flags

from electra_jax import cli
from electra_jax.parallel import topology
from electra_jax.runtime import packages

ENCODERS = ("small", "base", "large")
BERT_VOCAB = 30522  # the paper's vocabulary (BERT's uncased WordPiece), for fine-tuning configs with no tokenizer


def define_flags():
  return [
      config_flags.DEFINE_config_file("config", None, "A pre-training or fine-tuning config file.", lock_config=True),
      flags.DEFINE_string("tpu", None, "The accelerator type, as gcloud names it: v2-8, v3-8, v3-32, v4-8, v4-32, "
                          "v5e-8 (v5litepod-8), v5p-8, v6e-8, ..."),
      flags.DEFINE_string("gpu", None, "NVIDIA GPUs instead of a TPU slice: GPU[:COUNT] with GPU one of "
                          f"{', '.join(topology.GPUS)} (A100: 80 GB SXM), COUNT up to {topology.GPUS_PER_HOST} on "
                          f"one host or hosts of {topology.GPUS_PER_HOST}: h100, h200:8, a100:16."),
      flags.DEFINE_integer("num_slices", 1, "Slices of that type joined over the data-centre network (multislice)."),
      flags.DEFINE_enum("encoder", None, ENCODERS, "Fine-tuning configs without init_from: the paper's encoder of "
                        "this size (bfloat16) instead of config.model.")]


def _finetune_targets(ft, encoder, devices):
  """(targets, model FLOPs per train step, tokens per step, what the encoder is) of a fine-tuning config."""
  from electra_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from electra_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  from electra_jax.finetune import experiment, heads  # pylint: disable=g-import-not-at-top
  from electra_jax.model import flops, modeling
  from electra_jax.run import weights
  if ft.init_from:
    source = weights.load(ft.init_from, with_params=False).config
    what = ft.init_from
  else:
    source = config_lib.base()
    source.model.update(ft.model.to_dict())
    if encoder:  # the paper's sizes in bfloat16; how config.model runs them (remat, scan_layers, attention) stays
      sizes = config_lib.model_config(encoder)
      source.model.update(size=encoder, dtype="bfloat16", **{k: sizes[k] for k in config_lib.SIZE_KEYS})
    source.data.vocab_size = tokenizer_lib.Tokenizer(ft.tokenizer).vocab_size if ft.tokenizer else BERT_VOCAB
    what = f"{encoder or 'config.model'} encoder, vocabulary {source.data.vocab_size}"
  seq_len = min(ft.seq_len, source.model.max_position_embeddings)
  mc = experiment.encoder_config(ft, modeling.ModelConfig.from_config(source))
  labels = None if ft.task.type in ("regression", "qa") else ["0", "1"]  # the label count barely matters
  head = heads.head_type(ft.task)(labels)
  steps = experiment.build_steps(ft, head, mc, seq_len, num_steps=1000, devices=devices)
  model_flops = flops.encoder_flops(mc, mc.discriminator, ft.train.batch_size, seq_len)
  return (experiment.compile_targets(ft, head, steps, seq_len), model_flops, ft.train.batch_size * seq_len,
          f"{ft.task.type} on the {what}, {mc.dtype}, sequence length {seq_len}")


def _targets(config, encoder, devices):
  """_finetune_targets' four of a fine-tuning or pre-training config."""
  if "task" in config:
    return _finetune_targets(config, encoder, devices)
  if encoder:
    raise ValueError("--encoder applies to fine-tuning configs; a pre-training config's model.* is its encoder")
  import numpy as np  # pylint: disable=g-import-not-at-top
  from electra_jax.data.special_ids import SpecialIds  # pylint: disable=g-import-not-at-top
  from electra_jax.pretrain import experiment  # pylint: disable=g-import-not-at-top
  # Whole-word masking compiles the same program whichever pieces start words.
  word_starts = np.ones(config.data.vocab_size, bool) if config.objective.whole_word_masking else None
  exp = experiment.create(config, SpecialIds(), devices=devices, word_starts=word_starts)
  return (experiment.compile_targets(exp), exp.step_flops, config.train.batch_size * config.data.seq_len,
          f"{config.objective.name} pre-training, {config.model.dtype}, sequence length {config.data.seq_len}")


def _fit_error(config, name, slice_, devices, too_large, aot, memory_limit) -> str:
  """The one line for a train step that does not fit, with the largest batch that does (compiled to confirm)."""
  n = len(devices)
  accum = config.train.grad_accum_steps

  def compile_at(rows):
    trial = config.copy_and_resolve_references()
    with trial.unlocked():
      trial.train.batch_size = rows * n
    return aot.compile_step(*_targets(trial, None, devices)[0][0], memory_limit=memory_limit)  # the train step

  fit = aot.largest_fit(compile_at, too_large, config.train.batch_size // n, multiple=accum)
  what, room = ("of HBM in all", "of HBM") if too_large.whole else ("of temporaries", "of HBM left for them")
  need = (f"{name}'s {too_large.name} needs {aot.gib(too_large.need_bytes)} {what} per device at "
          f"train.batch_size={config.train.batch_size} ({config.train.batch_size // n} rows per device) where a "
          f"{slice_.name} device has {aot.gib(too_large.available_bytes)} {room}")
  remat = not config.model.remat  # a remedy only where it is not on already
  if fit is None:
    return (f"{need}; not even {accum} row(s) per device fit: set {'model.remat=True, ' * remat}mesh.fsdp (shard "
            "the weights) or a larger slice")
  rows = config.train.batch_size // n
  # The fewest micro-batches, each an equal share of every device's rows, that are no larger than what fits.
  micro = next(k for k in range(accum, rows + 1) if rows % k == 0 and rows // k <= fit.rows_per_device)
  found = ("the largest batch that fits is" if not fit.missed else
           f"the plan grows faster than the batch ({fit.missed} larger tries ran out of HBM): a batch that fits is")
  return (f"{need}; {found} train.batch_size={fit.rows_per_device * n} ({fit.rows_per_device} rows per device: it "
          f"compiles), or keep the batch with train.grad_accum_steps={micro}" + " or model.remat=True" * remat)


def _row(r, model_flops, tokens, n, hbm, peak) -> dict:
  row = dict(step=r.name, argument_bytes=r.argument_bytes, temp_bytes=r.temp_bytes, code_bytes=r.code_bytes,
             peak_bytes=r.peak_bytes, hbm_bytes=hbm, xla_flops=None if r.flops is None else r.flops * n,
             lower_s=r.lower_s, compile_s=r.compile_s, est_step_s=r.seconds, kernels=r.kernels)
  if r.name == "train step":
    row["model_flops"] = model_flops
    if r.seconds:
      row.update(est_tokens_per_sec=tokens / r.seconds,
                 est_mfu=model_flops / (r.seconds * n * peak) if peak else None)
  return row


_GIB, _TFLOP = (lambda v: f"{v / 2**30:.2f} GiB"), (lambda v: f"{v / 1e12:.2f}")
COLUMNS = [("step", "step", str), ("arguments", "argument_bytes", _GIB), ("temporaries", "temp_bytes", _GIB),
           ("code", "code_bytes", _GIB), ("peak", "peak_bytes", _GIB), ("HBM", "hbm_bytes", _GIB),
           ("XLA TFLOP", "xla_flops", _TFLOP), ("model TFLOP", "model_flops", _TFLOP),
           ("est. step", "est_step_s", "{:.4f} s".format), ("est. tokens/s", "est_tokens_per_sec", "{:,.0f}".format),
           ("est. MFU", "est_mfu", "{:.1%}".format), ("lower", "lower_s", "{:.0f} s".format),
           ("compile", "compile_s", "{:.0f} s".format)]


def _print_table(rows, cols):
  """`cols`: (title, key, how a value is written); a missing value is '-'."""
  table = [[title for title, _, _ in cols]] + [["-" if r.get(k) is None else fmt(r[k]) for _, k, fmt in cols]
                                               for r in rows]
  widths = [max(len(line[i]) for line in table) for i in range(len(cols))]
  for line in table:
    print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))))


def main(config, tpu, gpu, num_slices, encoder):
  import jax  # pylint: disable=g-import-not-at-top
  from electra_jax.model import flops  # pylint: disable=g-import-not-at-top
  from electra_jax.parallel import aot, sharding
  if bool(tpu) == bool(gpu):
    raise ValueError("give one target: --tpu=TYPE (a Cloud TPU slice) or --gpu=GPU[:COUNT] (NVIDIA GPUs)")
  if gpu and num_slices != 1:
    raise ValueError("--num_slices applies to TPU slices; for more GPUs give --gpu=GPU:COUNT")
  slice_ = topology.parse_gpu(gpu) if gpu else topology.parse(tpu, num_slices)
  memory_limit = slice_.hbm_bytes_per_device if gpu else None  # libtpu holds a plan to the HBM itself
  devices = slice_.devices()
  n, kind = len(devices), devices[0].device_kind
  name = config_flags.get_config_filename(flags.FLAGS["config"])
  t0 = time.perf_counter()
  targets, model_flops, tokens, what = _targets(config, encoder, devices)
  print(f"{name} on {slice_.name}: {n} x {kind} on {slice_.num_hosts} host(s), "
        f"{aot.gib(slice_.hbm_bytes_per_device)} HBM per device; {what}; batch {config.train.batch_size} "
        "(mesh data={} fsdp={})".format(*sharding.mesh_shape(**config.mesh, num_devices=n)), flush=True)
  reports = []
  for target in targets:
    try:
      reports.append(aot.compile_step(*target, memory_limit=memory_limit))
    except aot.OutOfMemory as e:
      if e.name != "train step":
        raise ValueError(f"{name}'s {e.name} does not fit a {slice_.name} device: {e}") from None
      raise ValueError(_fit_error(config, name, slice_, devices, e, aot, memory_limit)) from None
    except RuntimeError as e:  # JAX looks for cuDNN only when it traces fused attention for an NVIDIA GPU
      if "cuDNN" in str(e):
        packages.require("nvidia.cudnn", "fused attention for NVIDIA GPUs (cuDNN's flash attention; "
                         "model.attention_impl=einsum compiles without it)")
      raise
  peak = flops.peak_flops(devices[0])
  rows = [_row(r, model_flops, tokens, n, slice_.hbm_bytes_per_device, peak) for r in reports]
  _print_table(rows, COLUMNS)
  print()
  _print_table([dict(step=r["step"], total=sum(r["kernels"].values()), **r["kernels"]) for r in rows],
               [("kernels", "step", str)] + [(k, k, "{:,}".format) for k in (*aot.KERNEL_KINDS, "total")])
  train = rows[0]
  compiler = "jax-cuda12-plugin" if gpu else "libtpu"
  result = dict(config=name, **{"gpu" if gpu else "tpu": slice_.name}, devices=n, device_kind=kind,
                hosts=slice_.num_hosts, batch=config.train.batch_size, what=what, steps=rows, jax=jax.__version__,
                **{compiler: metadata.version(compiler)}, total_s=time.perf_counter() - t0)
  if train.get("est_step_s") and "task" not in config:
    days = config.train.num_steps * train["est_step_s"] / 86400
    result["est_days_to_num_steps"] = days
    print(f"Estimates are the TPU cost model's, not measurements: train.num_steps={config.train.num_steps:,} would "
          f"take ~{days:.2f} days ({days * 24:.1f} hours) of steps on {slice_.name}.")
  print(json.dumps(result))


def run():
  cli.run("electra-compile", __doc__, main, define_flags(), required=["config"])


if __name__ == "__main__":
  run()
