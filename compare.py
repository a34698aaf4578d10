"""The command: `python compare.py --help` (installed, also `dtensor-vs-mirrored`). Its code is
dtensor_vs_mirrored/shared/cli.py; this file keeps the repository's command where its users run it."""

from dtensor_vs_mirrored.shared.cli import command

if __name__ == "__main__":
    command()
