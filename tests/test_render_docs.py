"""The docs' tables of committed raw results (docs/gpu_runs/*/results.json) are what benchmarks/render_docs.py renders
from those files: a figure cannot change in one without the other."""
import pytest

from benchmarks import render_docs


def test_every_block_is_what_the_script_renders():
  pages = {p.name: p.read_text() for p in render_docs.pages()}
  assert {"benchmarks.md", "pretraining.md"} <= set(pages), "the GPU tables' blocks are gone"
  stale = [name for name, text in pages.items() if render_docs.render(text) != text]
  assert not stale, f"run python benchmarks/render_docs.py: stale blocks in {stale}"


def test_each_sitting_is_rendered():
  bench, pretrain = render_docs.gpu_bench(), render_docs.gpu_pretrain()
  for name, results in render_docs.sittings():
    if results["steps"].get("bench", {}).get("figures", {}).get("runs"):
      assert f"gpu_runs/{name}/" in bench
    for e in results["steps"].get("pretrain", {}).get("figures", {}).get("evals", []):
      assert f"| {e['step']:,} | {e['elapsed_s'] / 60:.1f} | {e['eval_disc_auc']:.3f} |" in pretrain


def test_an_unknown_block_is_refused():
  with pytest.raises(ValueError, match="unknown render_docs block 'nope'"):
    render_docs.render("<!-- render_docs: nope -->\nold\n<!-- /render_docs -->\n")
