"""Small samples of every trace format the loaders read (see README.md here for sources)."""

from pathlib import Path

SAMPLES = Path(__file__).resolve().parent
