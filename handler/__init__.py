"""warmstart's function shim: init phase, event sources, tasks and model backends.

Nothing here imports `transformers`, `sentence-transformers` or `boto3`: this package is the function's
import chain and its cold start is the product.
"""
