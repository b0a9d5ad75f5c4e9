"""Request to feeds to answer: embedding, rerank, classify, tensor; the text fields, tokens, arrays."""
