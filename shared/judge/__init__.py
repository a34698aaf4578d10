"""What is decided: numbers in, verdicts out. Parity against the reference, each verdict and the float64 runs
it needs, baselines, repeats and the sweep's marks. It never trains: it imports no training or run module."""
