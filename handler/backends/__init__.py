"""The backend contract and its engines (ONNX Runtime, PyTorch): weights, device, buffers."""
