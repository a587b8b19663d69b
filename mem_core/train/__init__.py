"""Training stages (tokenizer, pretrain, finetune, segment), each a ``run(config)``, and their shared helpers."""
