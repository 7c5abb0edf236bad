#!/usr/bin/env python3
"""Write the post-training fixtures: instruction pairs (SFT) and preference pairs (DPO) for the
tiny CPU recipe, into data/fixtures/posttraining/ (see the README there).

Seeded and deterministic, no network: `.venv/bin/python scripts/make_posttraining_fixtures.py`.
Pairs are built only from the battery's train prompts; its held-out prompts never appear.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ito_assets.posttraining.fixtures import instruction_pairs, preference_pairs, write_jsonl  # noqa: E402
from ito_assets.posttraining.pipeline import DPO_FILE, SFT_FILE, battery  # noqa: E402

OUT = ROOT / "data" / "fixtures" / "posttraining"
SEED = 20241129
# Two copies of each train prompt, 30% of SFT responses wrong (a near miss from the prompt):
# 800 train prompts -> 1,600 SFT pairs = 200 steps of 8 in one epoch (measured: enough for the
# answer format and part of the skill, on the `micro` model with characters and on the pretrained
# `tiny` model with the run's BPE, at a tiny-model learning rate).
SFT_COPIES, SFT_ERROR_RATE = 2, 0.3
DPO_COPIES = 1


def main() -> int:
    train, _ = battery()
    write_jsonl(OUT / SFT_FILE, instruction_pairs(train, copies=SFT_COPIES, seed=SEED, error_rate=SFT_ERROR_RATE))
    write_jsonl(OUT / DPO_FILE, preference_pairs(train, copies=DPO_COPIES, seed=SEED + 1))
    for name in (SFT_FILE, DPO_FILE):
        data = (OUT / name).read_bytes()
        lines = data.count(b"\n")
        print(f"{name}: {lines} pairs, {len(data):,} bytes, sha256 {hashlib.sha256(data).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
