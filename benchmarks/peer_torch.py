"""The peer: ELECTRA's training step with HF transformers in PyTorch, same sizes, batch and sequence length as ours.

  python benchmarks/peer_torch.py --config=configs/small.py --config.train.batch_size=32 [--compile] [--steps=10]

Generator ElectraForMaskedLM and discriminator ElectraForPreTraining sharing one embedding block (word, position,
token type, LayerNorm: ELECTRA's "shared" mode; the generator's output layer is tied to the word table), sized like
model/modeling.py ModelConfig.from_config; ELECTRA masking (15% of non-special tokens, 85% of them [MASK]), Gumbel
sampling, λ = disc_weight, AdamW with weight decay masked off LayerNorm and biases, global-norm clipping, dropout on.
HF's generator head runs at every position (as ElectraForMaskedLM does); --gather_head runs it at the masked
positions only, as ours does. Synthetic batches come from electra_jax.bench. It runs on the GPU when torch sees one
(else on the CPU, all cores), under bfloat16 autocast when the config's model.dtype is bfloat16 (parameters and
optimiser state stay float32, as ours). The last line of output is JSON.
"""
import json
import os
import time

import numpy as np
import torch
import transformers
from absl import app, flags

from electra_jax import bench
from electra_jax.data.special_ids import SpecialIds
from electra_jax.model import masking, modeling

FLAGS = flags.FLAGS
bench.define_flags()  # the peer takes electra-bench's command line
_COMPILE = flags.DEFINE_bool("compile", False, "torch.compile the loss (forward and, through AOTAutograd, backward).")
_COMPILE_BACKEND = flags.DEFINE_string("compile_backend", "inductor", "torch.compile's backend with --compile "
                                       "(aot_eager traces without generating code: a quick check of the path).")
_GATHER_HEAD = flags.DEFINE_bool("gather_head", False, "Generator head at the masked positions only.")


def hf_config(mc: modeling.ModelConfig, e: modeling.EncoderConfig) -> transformers.ElectraConfig:
  return transformers.ElectraConfig(
      vocab_size=mc.vocab_size, embedding_size=mc.embedding_size, hidden_size=e.hidden_size,
      num_hidden_layers=e.num_layers, num_attention_heads=e.num_heads, intermediate_size=e.intermediate_size,
      hidden_act="gelu", hidden_dropout_prob=mc.dropout_rate, attention_probs_dropout_prob=mc.attention_dropout_rate,
      max_position_embeddings=mc.max_position_embeddings, type_vocab_size=mc.type_vocab_size,
      initializer_range=mc.initializer_range, layer_norm_eps=mc.layer_norm_eps)


class Peer(torch.nn.Module):
  """Both networks, one shared embedding block, and ELECTRA's loss."""

  def __init__(self, config, special: SpecialIds, gather_head: bool):
    super().__init__()
    mc = modeling.ModelConfig.from_config(config)
    self.generator = transformers.ElectraForMaskedLM(hf_config(mc, mc.generator))
    self.discriminator = transformers.ElectraForPreTraining(hf_config(mc, mc.discriminator))
    self.discriminator.electra.embeddings = self.generator.electra.embeddings
    self.special, self.gather_head = special, gather_head
    self.mask_prob, self.disc_weight = config.objective.mask_prob, config.objective.disc_weight
    self.temperature = config.objective.temperature

  def mask(self, ids):
    """masking.mask_tokens in torch: top-P random scores among candidates, round(mask_prob·n) of them used."""
    s = self.special
    p = masking.max_predictions(self.mask_prob, ids.shape[1])
    candidate = (ids != s.pad) & (ids != s.cls) & (ids != s.sep)
    n = candidate.sum(1)
    chosen = torch.where(n > 0, torch.clamp(torch.round(n * self.mask_prob), 1, p), 0)
    positions = torch.where(candidate, torch.rand(ids.shape, device=ids.device), -1.0).topk(p, dim=1).indices
    weights = torch.arange(p, device=ids.device)[None, :] < chosen[:, None]
    targets = ids.gather(1, positions)
    replace = torch.rand(positions.shape, device=ids.device) < masking.MASK_TOKEN_FRACTION
    values = torch.where(weights & replace, s.mask, targets)
    return ids.scatter(1, positions, values), positions, targets, weights

  def forward(self, ids, seg):
    attention = ids != self.special.pad
    masked_ids, positions, targets, weights = self.mask(ids)
    g = self.generator
    if self.gather_head:
      h = g.electra(masked_ids, attention_mask=attention, token_type_ids=seg).last_hidden_state
      h = h.gather(1, positions[..., None].expand(-1, -1, h.shape[-1]))
      logits = g.generator_lm_head(g.generator_predictions(h))
    else:
      logits = g(masked_ids, attention_mask=attention, token_type_ids=seg).logits.gather(
          1, positions[..., None].expand(-1, -1, g.config.vocab_size))
    mlm = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    mlm = (mlm * weights.flatten()).sum() / weights.sum()
    with torch.no_grad():
      u = torch.rand(logits.shape, device=logits.device).clamp_(1e-20, 1.0)  # float32 noise under autocast too
      sampled = (logits.float() / self.temperature - torch.log(-torch.log(u))).argmax(-1)
      corrupted = ids.scatter(1, positions, torch.where(weights, sampled, targets))
    labels = (corrupted != ids).float()
    d_logits = self.discriminator(corrupted, attention_mask=attention, token_type_ids=seg).logits
    disc = torch.nn.functional.binary_cross_entropy_with_logits(d_logits, labels, reduction="none")
    disc = (disc * attention).sum() / attention.sum()
    return mlm + self.disc_weight * disc


def optimizer(model: torch.nn.Module, train) -> torch.optim.Optimizer:
  """AdamW with decoupled weight decay on every weight but LayerNorm parameters and biases (shared ones once)."""
  decay, no_decay = [], []
  for name, p in model.named_parameters():  # named_parameters() lists a shared parameter once
    (no_decay if name.endswith("bias") or "LayerNorm" in name else decay).append(p)
  return torch.optim.AdamW([dict(params=decay, weight_decay=train.weight_decay),
                            dict(params=no_decay, weight_decay=0.0)],
                           lr=train.learning_rate, betas=(train.adam_b1, train.adam_b2), eps=train.adam_eps)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if FLAGS.data_dir or FLAGS.pipeline:
    raise app.UsageError("the peer times the step on synthetic batches only")
  torch.set_num_threads(os.cpu_count())
  torch.manual_seed(0)
  config = FLAGS.config
  cuda = torch.cuda.is_available()
  device = torch.device("cuda" if cuda else "cpu")
  special = SpecialIds()
  model = Peer(config, special, _GATHER_HEAD.value).to(device).train()  # dropout on
  opt = optimizer(model, config.train)
  loss_fn = torch.compile(model, backend=_COMPILE_BACKEND.value) if _COMPILE.value else model
  autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.model.dtype == "bfloat16")
  rng = np.random.default_rng(0)
  batches = [{k: torch.from_numpy(v).long().to(device) for k, v in bench.synthetic_batch(
      rng, config.train.batch_size, config.data.seq_len, config.data.vocab_size, special).items()}
             for _ in range(bench.NUM_BATCHES)]

  def step(batch):
    opt.zero_grad(set_to_none=True)
    with autocast:  # the forward pass only; backward runs each op in the dtype its forward chose
      loss = loss_fn(batch["input_ids"], batch["segment_ids"])
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), config.train.clip_norm)
    opt.step()
    return loss

  sync = torch.cuda.synchronize if cuda else lambda: None  # GPU work is asynchronous: time it to the end
  t0 = time.perf_counter()
  for i in range(FLAGS.warmup):
    loss = step(batches[i % len(batches)])
  sync()
  warmup_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  for i in range(FLAGS.steps):
    loss = step(batches[i % len(batches)])
  sync()
  seconds = time.perf_counter() - t0
  tokens = FLAGS.steps * config.train.batch_size * config.data.seq_len
  name = bench.config_name()
  result = dict(config=name, peer="torch.compile" if _COMPILE.value else "eager",
                compile_backend=_COMPILE_BACKEND.value if _COMPILE.value else None, gather_head=_GATHER_HEAD.value,
                device=torch.cuda.get_device_name() if cuda else "cpu", threads=torch.get_num_threads(),
                batch=config.train.batch_size, seq_len=config.data.seq_len, dtype=config.model.dtype,
                attention_dropout_rate=config.model.attention_dropout_rate,
                attn_implementation=model.discriminator.config._attn_implementation,  # pylint: disable=protected-access
                step_time_s=seconds / FLAGS.steps, tokens_per_sec=tokens / seconds, warmup_s=warmup_s,
                loss=loss.item(), steps=FLAGS.steps, torch=torch.__version__, transformers=transformers.__version__)
  if cuda:
    result["device_peak_bytes_in_use"] = torch.cuda.max_memory_allocated()
  print(f"peer {result['peer']} {name}: batch {result['batch']} x {result['seq_len']}  step "
        f"{result['step_time_s'] * 1e3:.1f} ms  {result['tokens_per_sec']:.0f} tok/s")
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
