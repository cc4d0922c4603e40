"""What every layer shares about Triton models: their config.pbtxt, data types, tensors and
the one error a wrong setting raises. Imports nothing of the package above it."""
