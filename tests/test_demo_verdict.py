"""The end of `make demo` a newcomer reads: studies/finetune_demo.py's verdict says what happened in plain words, why at
a short budget (where the discriminator stands), and where pre-training is shown paying; table cells print as meant."""
from studies import finetune_demo


def _runs(pre: list[float], rnd: list[float], tfidf: float = 0.765) -> dict:
  return {"pre-trained": [dict(accuracy=a, f1=a, mcc=0.1, selected_step=948, learning_rate=3e-4, seconds=190.0)
                          for a in pre],
          "random init": [dict(accuracy=a, f1=a, mcc=0.1, selected_step=1000 + 2 * i, learning_rate=3e-4, seconds=200.0)
                          for i, a in enumerate(rnd)],
          "TF-IDF 1-2-gram + LR": [dict(accuracy=tfidf, f1=tfidf, mcc=0.5, seconds=3.0)]}


# The demo's pre-training at 2000 steps: its last evaluation (docs/pretraining.md: ~0.55, on the plateau).
DEMO = dict(step=2000, eval_disc_auc=0.549, flops=5.4e13)


def test_a_loss_at_the_demos_budget_says_why_and_where_pre_training_pays():
  runs = _runs([0.710], [0.735])
  text = finetune_demo.verdict("sentiment", 0, runs)
  assert text == ("sentiment, all labels: pre-training did not pay: random init scored 0.735, the pre-trained "
                  "encoder 0.710 (accuracy, 1 seed); TF-IDF 0.765.")
  why = " ".join(finetune_demo.why(DEMO, finetune_demo.pays(runs)))
  assert "2000 steps (5.4e13 FLOPs) of pre-training left the discriminator on the no-context plateau" in why
  assert "ROC AUC 0.549" in why and "at 104 times this run's FLOPs" in why
  assert "4,911 steps" in why and "H200" in why and "sentiment 0.656 against 0.636" in why  # docs/pretraining.md's


def test_a_difference_within_the_seed_spread_is_level_and_a_win_needs_no_excuse():
  level = finetune_demo.verdict("trec", 500, _runs([0.722, 0.730, 0.715], [0.735, 0.731, 0.740]))
  assert "are level" in level and "median of 3 seeds" in level and "did not pay" not in level
  runs = _runs([0.80], [0.70])
  assert "pre-training paid" in finetune_demo.verdict("sentiment", 0, runs)
  assert not finetune_demo.why(DEMO, finetune_demo.pays(runs))
  # Without the pre-training run's metrics (an export alone), the pointer to where it pays remains.
  assert finetune_demo.why(None, False)[0].startswith(
      "Where pre-training is shown paying (docs/pretraining.md): ELECTRA-Small")


def test_table_cells_print_counts_as_whole_numbers():
  rows = finetune_demo.table(_runs([0.710], [0.735, 0.74]))
  assert "| 948 |" in rows[2] and "948.000" not in rows[2]
  assert "| 1001 (1000-1002) |" in rows[3] and "| 0.710 |" in rows[2]
