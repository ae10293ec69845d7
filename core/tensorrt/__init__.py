"""TensorRT plans: what the release makes of the gpu pool's answer."""
