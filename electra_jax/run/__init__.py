"""What a run owns around its step: the shared loop (preemption too), checkpoints, the workdir and its lock, metrics and
TensorBoard, goodput, and where weights come from (sources, weights). Used by the commands; may import everything
below it (hf/, parallel/, model/, data/, config, runtime/)."""
