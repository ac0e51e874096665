"""Paths of the bundled assets used by the training tests."""

from pathlib import Path

import transformers

ASSETS = Path(__file__).resolve().parents[2] / "assets"
TINY_MODEL = ASSETS / "tiny-llama"
TRAIN_DATA = ASSETS / "data" / "train"
VALIDATION_DATA = ASSETS / "data" / "validation"

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
