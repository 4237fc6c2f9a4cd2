"""Central finite differences in float64, shared by the loss tests."""

import numpy as np


def finite_diff(f, x, eps=1e-6):
  """Gradient of scalar `f` at `x` by (f(x + eps e_i) - f(x - eps e_i)) / (2 eps) for every entry i."""
  x = np.asarray(x, np.float64)
  g = np.zeros_like(x)
  for idx in np.ndindex(x.shape):
    xp, xm = x.copy(), x.copy()
    xp[idx] += eps
    xm[idx] -= eps
    g[idx] = (f(xp) - f(xm)) / (2 * eps)
  return g
