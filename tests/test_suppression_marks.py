"""`# accelmigrate: skip[...]` as people write it: spaces, several codes."""

import pytest

from accelmigrate.codemods._base import ALL_CODES
from accelmigrate.engine.migrate import suppressions_in


@pytest.mark.parametrize(
    "comment, codes",
    [
        ("# accelmigrate: skip", ALL_CODES),
        ("# accelmigrate: skip[AM201]", frozenset({"AM201"})),
        ("# accelmigrate: skip [AM212]", frozenset({"AM212"})),
        ("# accelmigrate: skip[AM201 AM212]", frozenset({"AM201", "AM212"})),
        ("# accelmigrate: skip[am201, AM212]", frozenset({"AM201", "AM212"})),
        ("# accelmigrate:skip[AM101]  (loader of tensors)", frozenset({"AM101"})),
    ],
)
def test_a_skip_mark_silences_the_codes_it_names(comment, codes):
    assert suppressions_in(f"x = 1  {comment}\n") == {1: codes}


def test_a_word_that_only_starts_with_skip_is_no_mark():
    assert suppressions_in("x = 1  # accelmigrate: skipped on purpose\n") == {}
