"""Pallas kernels, each beside its pure-JAX reference; installed as `jaxpt.kernels`.

Imports only jax, never the rest of jaxpt; inside this folder imports are relative.
"""
