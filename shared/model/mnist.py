"""What the built-in models take and give: MNIST's 28x28 images, flattened to 784 pixels, and its 10 classes."""

IMAGE_SIDE = 28
IMAGE_PIXELS = IMAGE_SIDE * IMAGE_SIDE
NUM_CLASSES = 10
