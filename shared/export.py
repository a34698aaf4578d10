"""`python -m dtensor_vs_mirrored.shared.export DIR...`: reload each SavedModel that --export wrote and check it
serves the trainer's own logits (shared/training/export.py writes and checks them)."""

import sys

if __name__ == "__main__":  # before TensorFlow's import prints its start-up lines
    from dtensor_vs_mirrored.shared.console import hide_tensorflow_messages

    hide_tensorflow_messages("--verbose" in sys.argv[1:])

    from dtensor_vs_mirrored.shared.training.export import main

    sys.exit(main(sys.argv[1:]))
