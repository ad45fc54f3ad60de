"""Renders the docs' tables of committed raw results, so that a page's figures and the files they come from cannot drift.

A page holds a block between `<!-- render_docs: NAME -->` and `<!-- /render_docs -->`; NAME's renderer rebuilds it from
the GPU sittings' `docs/gpu_runs/*/results.json` (what benchmarks/gpu_run.py wrote there). Run it after committing a
sitting's files; tests/test_render_docs.py checks that every block is what this script renders.

  python benchmarks/render_docs.py            # rewrites the blocks in place
  python benchmarks/render_docs.py --check    # exit 1, naming each stale block, without writing
"""
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
RUNS = ROOT / "docs" / "gpu_runs"
BLOCK = re.compile(r"(<!-- render_docs: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /render_docs -->)", re.S)


def _table(columns: list[str], align: str, rows: list[list]) -> list[str]:
  """A Markdown table; `align` has one character per column: l (left) or r (right)."""
  return (["| " + " | ".join(columns) + " |", "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"] +
          ["| " + " | ".join(map(str, r)) + " |" for r in rows])


def sittings() -> list[tuple[str, dict]]:
  """(folder name, results.json) of every committed GPU sitting, oldest first."""
  return [(p.parent.name, json.loads(p.read_text())) for p in sorted(RUNS.glob("*/results.json"))]


def _where(name: str, results: dict) -> str:
  """The sitting's date, machine, software and commit (the one its README.md names: the bundle's)."""
  env = results["steps"].get("env", {}).get("figures", {})
  notes = RUNS / name / "README.md"
  commit = re.search(r"commit ([0-9a-f]{7,40})", notes.read_text()) if notes.exists() else None
  return (f"[gpu_runs/{name}](gpu_runs/{name}/), {name[:10]}, commit {commit[1] if commit else 'not recorded'}: "
          f"{env.get('nvidia_smi')}; Python {env.get('python')}, jax {env.get('jax')}, torch {env.get('torch')}.")


def gpu_bench() -> str:
  """Each sitting's electra-bench runs and ab's (gpu_ab.py): the step called back to back, and as the training loop
  drives it."""
  lines = []
  for name, results in sittings():
    runs = [r for step in ("bench", "ab") for r in results["steps"].get(step, {}).get("figures", {}).get("runs", [])
            if "result" in r]
    if not runs:
      continue
    lines += [_where(name, results), ""]
    lines += _table(
        ["config, batch × seq", "attention", "variant", "update", "XLA flags", "step ms", "tokens/s", "MFU", "loop ms",
         "loop tokens/s", "fusions", "instructions", "compile s"], "lllllrrrrrrrr",
        [[f"{b['config']}, {b['batch']} × {b['seq_len']}", b["attention_impl"], r.get("variant", "default"),
          "per array" if "--config.train.flat_update=False" in [*r["command"].split(), *r.get("overrides", [])]
          else "flat",
          f"`{r['xla_flags']}`" if r["xla_flags"] else "none", f"{b['step_time_s'] * 1e3:.2f}",
          f"{b['tokens_per_sec']:,.0f}", f"{b['mfu']:.1%}",
          f"{b['loop_step_time_s'] * 1e3:.2f}" if "loop_step_time_s" in b else "—",
          f"{b['loop_tokens_per_sec']:,.0f}" if "loop_tokens_per_sec" in b else "—", f"{b['fusions']:,}",
          f"{b['hlo_instructions']:,}", f"{b['compile_s']:.1f}"]
         for r in runs for b in [r["result"]]])
    lines.append("")
  return "\n".join(lines)


def gpu_pretrain() -> str:
  """Each sitting's time-boxed pre-training: its held-out evaluations."""
  lines = []
  for name, results in sittings():
    pre = results["steps"].get("pretrain", {}).get("figures", {})
    if not pre.get("evals"):
      continue
    lines += [_where(name, results) + f" Stopped at step {pre['last_step']:,}"
              f"{' by the deadline' if pre['run']['stopped_at_deadline'] else ''}; median "
              f"{pre['median_tokens_per_sec']:,.0f} tokens/s over its log rows.", ""]
    lines += _table(["step", "minutes", "held-out D ROC AUC", "D recall", "D precision", "G MLM accuracy"], "rrrrrr",
                    [[f"{e['step']:,}", f"{e['elapsed_s'] / 60:.1f}", f"{e['eval_disc_auc']:.3f}",
                      f"{e['eval_disc_recall']:.3f}", f"{e['eval_disc_precision']:.3f}",
                      f"{e['eval_mlm_accuracy']:.3f}"] for e in pre["evals"]])
    lines.append("")
  return "\n".join(lines)


RENDERERS = {"gpu-bench": gpu_bench, "gpu-pretrain": gpu_pretrain}


def render(text: str) -> str:
  """`text` with every block rendered anew; an unknown block name is an error."""
  def block(m):
    if m["name"] not in RENDERERS:
      raise ValueError(f"unknown render_docs block {m['name']!r} (known: {', '.join(RENDERERS)})")
    return m.group(1) + RENDERERS[m["name"]]() + m.group(4)
  return BLOCK.sub(block, text)


def pages() -> list[pathlib.Path]:
  """The docs pages that hold a block."""
  return [p for p in sorted((ROOT / "docs").glob("*.md")) if BLOCK.search(p.read_text())]


def main(argv: list[str]) -> int:
  check = argv[1:] == ["--check"]
  if argv[1:] and not check:
    print(f"render_docs: error: unexpected arguments {argv[1:]} (only --check)", file=sys.stderr)
    return 2
  stale = []
  for page in pages():
    text = page.read_text()
    rendered = render(text)
    if rendered != text:
      stale.append(str(page.relative_to(ROOT)))
      if not check:
        page.write_text(rendered)
  if stale:
    print(("stale: " if check else "rewrote: ") + ", ".join(stale))
  return 1 if stale and check else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
