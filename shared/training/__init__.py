"""How one trainer trains: the loop every trainer shares (loop.py) and its contract (protocol.py), the reference
trainer, the trainers by name (registry.py), data and batches, optimizer, loss, checkpoints and export."""
