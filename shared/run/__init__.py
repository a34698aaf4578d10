"""What sequences a run: the only layer that trains and judges. sequence.py trains and judges one run
(plan.py: what it trains and how); comparison.py is compare.py in one process, sweep.py the device
sweep (lanes.py: its configurations trained two at a time), clients.py --clients."""
