"""Request to feeds to answer: embedding, rerank, classify, tensor, generate; the text fields, tokens, arrays, chat."""
