"""A real full disk (ENOSPC from a small tmpfs, mounted in a private mount namespace by `unshare`, which needs no
root where user namespaces are allowed) under the commands: one line naming the output and the space, exit 1, and
what was complete before still loads."""
import filecmp
import os
import re
import subprocess
import sys

import pytest

from electra_jax import weights
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
                      rf"the earlier {disk}/export is unchanged; free space or write elsewhere, then re-run", last), last
  comparison = filecmp.dircmp(tmp_path / "probe", tmp_path / "kept")
  assert not comparison.left_only and not comparison.right_only, comparison.report()
  assert weights.load(str(tmp_path / "kept")).params
