"""Short versions of the reliability scenarios (`make reliability` runs the long ones and
prints the table): crashes, broker faults, hostile input, fuzzing, hostile state, panics."""
import pytest

import reliability


@pytest.mark.parametrize("scenario", reliability.SCENARIOS, ids=lambda s: s.__name__)
def test_scenario(scenario):
    row = scenario("short")
    assert row["exact"] and row["lost"] == 0 and row["doubled"] == 0, row
