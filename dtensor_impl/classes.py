"""The logits every loss and accuracy on the mesh reads: relaid out so that the class dimension is whole.

DTensor's `tf.nn.sparse_softmax_cross_entropy_with_logits` over logits whose class dimension is split on a mesh
axis returns 0.0, silently, and its gradient is wrong (TensorFlow 2.21: docs/parity.md, "Known DTensor defects";
`python -m release_matrix.split_classes`). A column-parallel head splits it: a Keras Dense whose kernel is
`(None, "model")`, keras-hub Gemma's tied embedding. So the model's output on the mesh is relaid out to the
batch split alone, every other dimension whole, before any loss or arg-max sees it: the softmax cross-entropy, a
model's own loss, the accuracy. Where the classes were already whole (a replicated head) the relayout is the same
layout and DTensor adds nothing; where they were split it all-gathers the logits over the model axis (the probe
measured it against a vocabulary-parallel cross-entropy, whose max and sum are all-reduced: docs/parity.md).
"""

from tensorflow.experimental import dtensor

from dtensor_vs_mirrored.shared.model.definition import BATCH_AXIS, UNSHARDED


def whole_classes(mesh: dtensor.Mesh):
    """logits [N, ..., classes] on `mesh` -> the same values split on the batch axis alone (Model's `output`)."""

    def relaid(logits):
        return dtensor.relayout(logits, dtensor.Layout([BATCH_AXIS] + [UNSHARDED] * (logits.shape.rank - 1), mesh))

    return relaid
