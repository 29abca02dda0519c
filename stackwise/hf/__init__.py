"""Hugging Face causal LMs through the same Trainer: loading (bitsandbytes 4/8-bit), PEFT LoRA,
the loss over instruction targets, and the files a fine-tuned run leaves."""
