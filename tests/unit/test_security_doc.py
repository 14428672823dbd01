"""docs/security.md shows the permission map as it is (pigeon.api.permissions.table_markdown)."""

import os

from pigeon.api.permissions import table_markdown


def test_the_documented_permission_table_is_the_map():
    doc = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "security.md"), encoding="utf-8").read()
    assert table_markdown() in doc, "docs/security.md: paste pigeon.api.permissions.table_markdown() again"
