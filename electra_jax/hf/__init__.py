"""HF transformers interchange: parameter conversion, the tokenizer, and ELECTRA directories. May import parallel/,
model/, data/, config and runtime/."""
