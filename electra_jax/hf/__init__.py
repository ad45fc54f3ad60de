"""HF transformers interchange: parameter conversion, the tokenizer, and ELECTRA directories."""
