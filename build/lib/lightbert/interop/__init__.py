"""Interoperability: Hugging Face directories, ONNX export, the convert command."""
