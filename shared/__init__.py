"""Shared parts of the comparison: data, model sizes and initial values, loss,
accuracy, optimizer maths, config, result record and the reference trainer.

The distributed trainers differ from each other only in how they distribute;
everything they must agree on lives here, written once.
"""
