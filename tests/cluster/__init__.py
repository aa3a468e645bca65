from pathlib import Path

#: the checkout the tests run from
ROOT = Path(__file__).resolve().parents[2]
