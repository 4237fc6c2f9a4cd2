"""Pallas kernels, each beside its pure-JAX reference. Imports only jax (never jaxpt)."""
