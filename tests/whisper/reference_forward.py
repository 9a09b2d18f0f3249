"""An independent float64 Whisper forward pass in plain numpy, written from the papers'
block diagram (openai-whisper's model.py): no KV cache, no planner, no ops."""

from __future__ import annotations

import numpy as np
from scipy.special import erf


def gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


def layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * g + b


def conv1d(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int) -> np.ndarray:
    """x (C, L), w (O, C, 3), padding 1 -> (O, L_out)."""
    xp = np.pad(x, ((0, 0), (1, 1)))
    l_out = (x.shape[1] + 2 - 3) // stride + 1
    out = np.zeros((w.shape[0], l_out))
    for k in range(3):
        out += w[:, :, k] @ xp[:, k : k + stride * l_out : stride]
    return out + b[:, None]


class Reference:
    def __init__(self, weights, n_head_audio: int, n_head_text: int) -> None:
        self.w = weights
        self.ha, self.ht = n_head_audio, n_head_text

    def p(self, name: str) -> np.ndarray:
        return np.asarray(self.w.get(name), dtype=np.float64)

    def attention(
        self, x: np.ndarray, src: np.ndarray, prefix: str, n_head: int, fused_q: bool, causal: bool
    ) -> np.ndarray:
        d = x.shape[1]
        if fused_q:
            w, b = self.p(f"{prefix}/linear_0/weight"), self.p(f"{prefix}/linear_0/bias")
            q, k, v = (x @ w[i * d : (i + 1) * d].T + b[i * d : (i + 1) * d] for i in range(3))
            out_name = "linear_1"
        else:
            q = x @ self.p(f"{prefix}/linear_0/weight").T + self.p(f"{prefix}/linear_0/bias")
            w, b = self.p(f"{prefix}/linear_1/weight"), self.p(f"{prefix}/linear_1/bias")
            k = src @ w[:d].T + b[:d]
            v = src @ w[d:].T + b[d:]
            out_name = "linear_2"
        dh = d // n_head
        out = np.zeros_like(q)
        for h in range(n_head):
            sl = slice(h * dh, (h + 1) * dh)
            s = q[:, sl] @ k[:, sl].T / np.sqrt(dh)
            if causal:
                s = s + np.triu(np.full(s.shape, -np.inf), 1)
            s = np.exp(s - s.max(-1, keepdims=True))
            out[:, sl] = (s / s.sum(-1, keepdims=True)) @ v[:, sl]
        return out @ self.p(f"{prefix}/{out_name}/weight").T + self.p(f"{prefix}/{out_name}/bias")

    def mlp(self, x: np.ndarray, prefix: str) -> np.ndarray:
        h = layer_norm(x, self.p(f"{prefix}/layer_norm/gamma"), self.p(f"{prefix}/layer_norm/beta"))
        h = gelu(h @ self.p(f"{prefix}/linear_0/weight").T + self.p(f"{prefix}/linear_0/bias"))
        return x + h @ self.p(f"{prefix}/linear_1/weight").T + self.p(f"{prefix}/linear_1/bias")

    def n_layers(self, stack: str) -> int:
        """How many layers the "encoder" or "decoder" stack has (counted in the weights)."""
        return sum(1 for i in range(64) if f"{stack}/layer_{i}/ffn/linear_0/weight" in self.w.model)

    def ln(self, x: np.ndarray, prefix: str) -> np.ndarray:
        return layer_norm(x, self.p(f"{prefix}/gamma"), self.p(f"{prefix}/beta"))

    def encode(self, mel: np.ndarray) -> np.ndarray:
        x = gelu(
            conv1d(
                mel.astype(np.float64),
                self.p("encoder/conv1/weight"),
                self.p("encoder/conv1/bias"),
                1,
            )
        )
        x = gelu(conv1d(x, self.p("encoder/conv2/weight"), self.p("encoder/conv2/bias"), 2)).T
        x = x + self.p("encoder/position_encodings/encodings")[: len(x)]  # narrowed: the first
        for i in range(self.n_layers("encoder")):
            pre = f"encoder/layer_{i}"
            h = self.ln(x, f"{pre}/self_attention/layer_norm")
            x = x + self.attention(h, h, f"{pre}/self_attention", self.ha, True, False)
            x = self.mlp(x, f"{pre}/ffn")
        return self.ln(x, "encoder/layer_norm")

    def logits(self, enc: np.ndarray, tokens: list[int]) -> np.ndarray:
        """Logits of every position, shape (len(tokens), V)."""
        emb = self.p("decoder/embeddings/weight")
        x = emb[tokens] + self.p("decoder/position_encodings/encodings")[: len(tokens)]
        for i in range(self.n_layers("decoder")):
            pre = f"decoder/layer_{i}"
            h = self.ln(x, f"{pre}/self_attention/layer_norm")
            x = x + self.attention(h, h, f"{pre}/self_attention", self.ht, True, True)
            h = self.ln(x, f"{pre}/attention/layer_norm")
            x = x + self.attention(h, enc, f"{pre}/attention", self.ht, False, False)
            x = self.mlp(x, f"{pre}/ffn")
        return self.ln(x, "decoder/layer_norm") @ emb.T
