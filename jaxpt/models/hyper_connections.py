"""Multi-stream residual connections: Hyper-Connections (static, dynamic), mHC (Sinkhorn) and mHC-lite.

The residual stream is widened to n = `hc_streams` streams, `streams = (x_1, ..., x_n)`, each [batch, seq, d_model];
stacked they are X [batch, seq, n, d_model] (per token the papers' x_l in R^{n x C}). TransformerLM copies the
embedding to every stream; `OutputMerge` reads LN_final(x_1 + ... + x_n) (HC's sum of the streams, then the final
norm). Each sub-layer F (attention, then the MLP, each with its own Pre-Norm LN) is wrapped by one connection,
written in mHC's form (arXiv 2512.24880, eq. 3):

    X' = R X + p^T F(LN(q X))        q (pre) [1, n], p (post) [1, n], R (res) [n, n], per token
    i.e. x'_i = sum_j R_ij x_j + p_i F(LN(sum_j q_j x_j))

The four schemes (`ModelConfig.norm_scheme`) differ only in how (q, p, R) are made. k = 2l for the attention and
2l + 1 for the MLP connection of block l.

- `hc`, static Hyper-Connections (arXiv 2409.19606, §2.1-2.2): learned, token-independent; initialised so the
  block is Pre-Norm on stream k mod n:  q = e_{k mod n},  R = I_n,  p = 1_n.  In HC's own notation (the HC matrix
  [[0, B], [A_m, A_r]], eq. 1; h_0 = A_m^T H and H' = B^T T(h_0)^T + A_r^T H, eqs. 3-5): A_m = q^T, A_r = R^T,
  B = p. The parameters are stored as offsets from that initialisation (they start at 0; the layer index, traced
  under nn.scan, enters as a constant, never through an initializer).
- `hc_dynamic` (DHC, HC §2.3, eqs. 10-13): the static values plus token-dependent terms of H^ = LN_hc(X) (each
  stream normalised over d_model):
      q = q_s + s_a tanh(H^ w_q)^T,   R^T = R_s^T + s_a tanh(H^ W_r),   p = p_s + s_b tanh(H^ w_p)^T
  w_q, w_p [d_model] and W_r [d_model, n] start at 0 and s_a, s_b at 0.01, so the block starts as static HC.
- `mhc` (mHC, arXiv 2512.24880 §4.1, eqs. 7-8): from the whole token x~ = RMSNorm(vec X) [n d_model]:
      q = sigmoid(a_pre (x~ phi_pre) + b_pre),  p = 2 sigmoid(a_post (x~ phi_post) + b_post),
      R = Sinkhorn(a_res mat(x~ phi_res) + b_res)
  Sinkhorn(A) (eq. 9): M = exp(A), then t_max times: rows scaled to sum 1, then columns (t_max =
  `hc_sinkhorn_iterations`, 20 as in the paper): the columns sum to 1 exactly, the rows to within the tolerance
  left by t_max iterations. Initialisation as MaxText's: phi ~ N(0, 1 / (n d_model)), a = 0.01, b = 0.
- `mhc_lite` (arXiv 2601.05732): q and p as mHC; R = sum_k c_k P_k over all n! permutation matrices P_k with
  c = softmax(a_res (x~ phi_res) + b_res), phi_res [n d_model, n!]: a convex combination of permutations, so
  exactly doubly stochastic (Birkhoff-von Neumann), with no iteration.

The mappings are computed in float32 and cast to the compute dtype before they mix the streams. Parameters:
the d_model-wide projections and norms carry the logical axis `embed`; the small n x n mixing parameters and
scalars (stored as [1]) have unnamed (replicated) axes.
"""

from __future__ import annotations

import itertools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxpt.models.config import ModelConfig
from jaxpt.nn.norms import make_norm

STREAM_AXES = ("batch", "length", None, "embed")  # stacked streams X [batch, seq, n, d_model]
DYNAMIC_SCALE_INIT = 0.01  # s_a, s_b (HC) and a_pre, a_post, a_res (mHC) at initialisation


def sinkhorn(logits, iterations: int):
  """Sinkhorn-Knopp of exp(logits) [..., n, n]: `iterations` (>= 1) times rows then columns scaled to sum 1 (mHC
  eq. 9). The first iteration runs in the log domain (logits minus the log-sum-exp of each row, then of each
  column), so no row or column of exp(logits) has to be represented: after it every column sums to 1 and every row
  to at least 1 / n (a row summed to 1 and the column step divides each entry by at most n), so the remaining
  iterations divide by sums within [1 / n, n]. Starting from exp(logits - max) instead, a row or column lying ~87
  below the max underflowed to zeros and gave 0 / 0 (a depth-sweep tuning run at lr 0.1 stopped on NaN at step
  29)."""
  if iterations < 1:
    raise ValueError(f"sinkhorn: iterations={iterations}, must be >= 1")
  m = logits - jax.nn.logsumexp(logits, axis=-1, keepdims=True)
  m = jnp.exp(m - jax.nn.logsumexp(m, axis=-2, keepdims=True))
  for _ in range(iterations - 1):
    m = m / jnp.sum(m, axis=-1, keepdims=True)
    m = m / jnp.sum(m, axis=-2, keepdims=True)
  return m


def permutation_matrices(n: int) -> np.ndarray:
  """All n! permutation matrices [n!, n, n] (P_k[i, sigma_k(i)] = 1), identity first."""
  perms = list(itertools.permutations(range(n)))
  return np.eye(n, dtype=np.float32)[np.asarray(perms)]


def read_streams(pre, streams):
  """The sub-layer's input sum_j q_j x_j: pre [batch, seq, n], streams X [batch, seq, n, d] -> [batch, seq, d]."""
  return jnp.einsum("bsn,bsnd->bsd", pre, streams)


def write_streams(res, streams, post, out):
  """X' = R X + p^T out: res [batch, seq, n, n], post [batch, seq, n], out [batch, seq, d] -> [batch, seq, n, d]."""
  return jnp.einsum("bsij,bsjd->bsid", res, streams) + post[..., None] * out[:, :, None, :]


class HyperConnection(nn.Module):
  """One sub-layer's connection: X [batch, seq, n, d_model], k -> (q, p, R) in the compute dtype, shaped
  [batch, seq, n], [batch, seq, n], [batch, seq, n, n] (see the module docstring for each scheme)."""

  config: ModelConfig

  @nn.compact
  def __call__(self, streams, k):
    cfg = self.config
    x = streams.astype(jnp.float32)
    if cfg.norm_scheme in ("hc", "hc_dynamic"):
      pre, post, res = self.hyper_connection(x, k)
    else:
      pre, post, res = self.manifold_connection(x)
    dtype = jnp.dtype(cfg.dtype)
    return pre.astype(dtype), post.astype(dtype), res.astype(dtype)

  def declare(self, name, shape, axes, init=nn.initializers.zeros):
    return self.param(name, nn.with_logical_partitioning(init, axes), shape,
                      jnp.dtype(self.config.param_dtype)).astype(jnp.float32)

  def hyper_connection(self, x, k):
    """HC: static (offsets from q = e_{k mod n}, R = I, p = 1), plus DHC's tanh terms for `hc_dynamic`."""
    cfg, n = self.config, x.shape[2]
    pre = jnp.eye(n, dtype=jnp.float32)[jnp.mod(k, n)] + self.declare("static_pre", (n,), (None,))
    post = 1.0 + self.declare("static_post", (n,), (None,))
    res = jnp.eye(n, dtype=jnp.float32) + self.declare("static_res", (n, n), (None, None))
    pre, post, res = (jnp.broadcast_to(t, x.shape[:2] + t.shape) for t in (pre, post, res))
    if cfg.norm_scheme == "hc":
      return pre, post, res
    d = x.shape[-1]
    h = make_norm(cfg.norm_type, cfg.norm_eps, jnp.float32, jnp.dtype(cfg.param_dtype), "stream_norm")(x)
    scale = lambda name: self.declare(name, (1,), (None,), nn.initializers.constant(DYNAMIC_SCALE_INIT))
    s_alpha, s_beta = scale("scale_alpha"), scale("scale_beta")
    w_pre = self.declare("dynamic_pre", (d,), ("embed",))
    w_post = self.declare("dynamic_post", (d,), ("embed",))
    w_res = self.declare("dynamic_res", (d, n), ("embed", None))
    pre = pre + s_alpha * jnp.tanh(h @ w_pre)
    post = post + s_beta * jnp.tanh(h @ w_post)
    res = res + s_alpha * jnp.swapaxes(jnp.tanh(h @ w_res), -1, -2)  # row j of tanh(H^ W_r) is column j of R
    return pre, post, res

  def manifold_connection(self, x):
    """mHC / mHC-lite: sigmoid pre and post maps and a doubly stochastic R from RMSNorm(vec X)."""
    cfg = self.config
    n, d = x.shape[2], x.shape[3]
    lite = cfg.norm_scheme == "mhc_lite"
    res_width = math.factorial(n) if lite else n * n
    scale = self.declare("stream_norm_scale", (n, d), (None, "embed"), nn.initializers.ones)
    normed = x * jnp.reciprocal(jnp.sqrt(jnp.mean(jnp.square(x), axis=(-2, -1), keepdims=True) + cfg.norm_eps))
    phi = self.declare("phi", (n, d, 2 * n + res_width), (None, "embed", None),
                      nn.initializers.normal(1.0 / math.sqrt(n * d)))
    logits = jnp.einsum("bsnd,ndm->bsm", normed * scale, phi)
    alpha = {name: self.declare(f"scale_{name}", (1,), (None,), nn.initializers.constant(DYNAMIC_SCALE_INIT))
             for name in ("pre", "post", "res")}
    bias_res_shape = (res_width,) if lite else (n, n)
    bias = {"pre": self.declare("bias_pre", (n,), (None,)), "post": self.declare("bias_post", (n,), (None,)),
            "res": self.declare("bias_res", bias_res_shape, (None,) * len(bias_res_shape))}
    pre = nn.sigmoid(alpha["pre"] * logits[..., :n] + bias["pre"])
    post = 2.0 * nn.sigmoid(alpha["post"] * logits[..., n:2 * n] + bias["post"])
    res_logits = logits[..., 2 * n:]
    if lite:
      weights = nn.softmax(alpha["res"] * res_logits + bias["res"], axis=-1)
      res = jnp.einsum("bsk,kij->bsij", weights, jnp.asarray(permutation_matrices(n)))
    else:
      res = sinkhorn(alpha["res"] * res_logits.reshape(res_logits.shape[:-1] + (n, n)) + bias["res"],
                     cfg.hc_sinkhorn_iterations)
    return pre, post, res
