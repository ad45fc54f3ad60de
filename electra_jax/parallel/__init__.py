"""Spreading the step over devices: the mesh and every sharding (sharding), the train state and its optimiser update
with micro-batches, compiling ahead of time for TPU slices and GPUs (aot, topology, gpu_targets/). May import model/,
data/, config and runtime/."""
