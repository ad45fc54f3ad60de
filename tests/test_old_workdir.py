"""A workdir saved by an older electra_jax resumes and exports with today's code.

tests/data/old_workdir/ is configs/tiny.py pre-trained for 4 steps (one checkpoint) at 11a9d56, the commit before the
package moved into layer folders, with OLD_FLAGS (a narrower model, to keep the checkpoint small); its TensorBoard
events are left out. Its config.json names the data_dir it was prepared in then; as a user whose data moved would,
the resume names today's with --config.data.data_dir (a key a resume may change)."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests import pretrain_cli

OLD_WORKDIR = os.path.join(pretrain_cli.ROOT, "tests", "data", "old_workdir")
OLD_FLAGS = ("--config.model.hidden_size=32", "--config.model.intermediate_size=64",
             "--config.model.embedding_size=8", "--config.model.max_position_embeddings=64")


@pytest.mark.slow
def test_an_old_workdir_resumes_and_exports(tiny_data, tmp_path):
  config, _ = tiny_data
  workdir = str(tmp_path / "old_workdir")
  shutil.copytree(OLD_WORKDIR, workdir)
  r = pretrain_cli.run(pretrain_cli.env(), config, workdir, *OLD_FLAGS, "--config.train.num_steps=6")
  assert r.returncode == 0, r.stderr[-3000:]
  with open(os.path.join(workdir, "plan.json"), encoding="utf-8") as f:
    assert json.load(f)["start"]["resume_step"] == 4
  assert pretrain_cli.logged_steps(workdir) == [2, 4, 6]
  assert pretrain_cli.checkpoint_dirs(workdir) == ["4", "6"]

  out = tmp_path / "export"
  r = subprocess.run([sys.executable, "-m", "electra_jax.export", f"--workdir={workdir}", f"--output={out}"],
                     cwd=pretrain_cli.ROOT, env=pretrain_cli.env(), capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  discriminator = transformers.ElectraForPreTraining.from_pretrained(out)
  generator = transformers.ElectraForMaskedLM.from_pretrained(out / "generator")
  inputs = transformers.AutoTokenizer.from_pretrained(out)(["The state of the union is strong."], return_tensors="pt")
  with torch.no_grad():
    assert np.isfinite(discriminator(**inputs).logits.numpy()).all()
    assert np.isfinite(generator(**inputs).logits.numpy()).all()
  # The export holds the resumed run's weights: step 6's, which moved on from the old step 4's.
  saved = {step: pretrain_cli.saved_arrays(os.path.join(workdir, "checkpoints", step))
           ["params.embeddings.word_embeddings"].read().result() for step in ("4", "6")}
  exported = discriminator.electra.embeddings.word_embeddings.weight.detach().numpy()
  np.testing.assert_array_equal(exported, saved["6"])
  assert not np.array_equal(saved["4"], saved["6"])
