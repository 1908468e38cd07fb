"""The text read side: tokenizer, blocks, dataset, TextLoader."""
