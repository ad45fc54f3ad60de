"""`make replicate`: the paper's objective ablation at equal FLOPs; run it as `python -m studies.replicate`."""
