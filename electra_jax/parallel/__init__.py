"""Spreading the step over devices: the mesh and every sharding (sharding), the train state and its optimiser update
(state, optim), micro-batches (accumulate), compiling ahead of time for TPU slices and GPUs (aot, topology). May import
model/, data/, config and runtime/."""
