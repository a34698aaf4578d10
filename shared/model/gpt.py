"""A small character-level GPT on tiny Shakespeare, with Megatron-style tensor-parallel layouts.

Tokens are the text's 65 characters; context 64, width 64, 8 heads of 8, 2 pre-norm blocks (layer norm,
causal attention, layer norm, MLP of 256 with GELU, residuals), learned position embeddings, a final layer
norm and an untied output layer (its own [64, 65] weight: tying it to the token embedding would make one
variable both gathered and multiplied, and the embedding's gradient the sum of a sparse and a dense part).
The loss is the next character's cross-entropy at every position. On a mesh with a `model` axis the heads
and the MLP's units are split as the ViT's (shared/model/blocks.py); the embeddings and the output layer are
replicated (65 characters divide over no model axis). The position embedding is added through
tf.expand_dims: `wpe[None]` on a DTensor kills the process (docs/models.md).
"""

import functools

import tensorflow as tf

from dtensor_vs_mirrored.shared.model.blocks import block, block_variables, layer_norm
from dtensor_vs_mirrored.shared.model.definition import ModelDefinition, Variable, ones, truncated_normal

# The characters of tiny Shakespeare, in code-point order: token i is VOCABULARY[i].
VOCABULARY = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
CONTEXT, WIDTH, HEADS, MLP_UNITS, BLOCKS = 64, 64, 8, 256, 2
INIT_STDDEV = 0.02


def forward(v, tokens, context, dropout: float = 0.0):
    """tokens [N, 64] int32 -> logits [N, 64, 65]: at each position, the next character's."""
    x = tf.gather(v["token"], tokens) + tf.expand_dims(v["position"], 0)
    x = context.dropout(context.tap("embedding", x), dropout)
    for index in range(BLOCKS):
        x = block(v, f"blocks/{index}/", x, context, causal=True, dropout=dropout)
    x = context.tap("norm", layer_norm(x, v["norm/scale"], v["norm/offset"]))
    return context.tap("head", tf.einsum("ntd,dc->ntc", x, v["head/w"]) + v["head/b"])


def flops_per_token() -> int:
    """Forward matmuls and einsums per position x 3 (forward + backward); norms, softmax and GELU not counted.
    Attention counts every position pair (the mask zeroes half of them after they are computed)."""
    per_block = 3 * WIDTH * WIDTH + 2 * CONTEXT * WIDTH + WIDTH * WIDTH + 2 * WIDTH * MLP_UNITS
    return 3 * 2 * (BLOCKS * per_block + WIDTH * len(VOCABULARY))


def gpt(dropout: float = 0.0) -> ModelDefinition:
    streams = iter(range(1, 1000))  # one random stream per drawn variable

    def weight(name, shape, layout=()):
        return Variable(name, shape, truncated_normal(INIT_STDDEV, next(streams)), layout)

    variables = [weight("token", (len(VOCABULARY), WIDTH)), weight("position", (CONTEXT, WIDTH))]
    for index in range(BLOCKS):
        variables += block_variables(f"blocks/{index}/", WIDTH, HEADS, MLP_UNITS, weight)
    variables += [
        Variable("norm/scale", (WIDTH,), ones),
        Variable("norm/offset", (WIDTH,)),
        weight("head/w", (WIDTH, len(VOCABULARY))),
        Variable("head/b", (len(VOCABULARY),)),
    ]
    return ModelDefinition(
        independent_examples=True,
        name=f"gpt context {CONTEXT} width {WIDTH} heads {HEADS} mlp {MLP_UNITS} blocks {BLOCKS}",
        variables=tuple(variables),
        forward=functools.partial(forward, dropout=dropout),
        flops_per_example=CONTEXT * flops_per_token(),
        description=f"character GPT, context {CONTEXT}, width {WIDTH}, {HEADS} heads, MLP {MLP_UNITS}, {BLOCKS} blocks"
        + (f", dropout {dropout}" if dropout else ""),
        input_shape=(CONTEXT,),
        input_dtype="int32",
        label_shape=(CONTEXT,),
        classes=len(VOCABULARY),
        default_data="tiny_shakespeare",
        vocabulary=len(VOCABULARY),
    )
