"""broker.resources' part of message transforms: their shape, which run (`disabled`), and the kinds refused."""

import pytest

from pigeon.broker import resources
from pigeon.core.errors import InvalidArgument, Unimplemented


def topic(*udfs, **extra):
    t = resources.Topic(name="projects/p/topics/topic")
    for name, disabled in udfs:
        m = t.message_transforms.add(disabled=disabled)
        m.javascript_udf.function_name, m.javascript_udf.code = name, f"function {name}(m) {{ return m; }}"
    for k, v in extra.items():
        setattr(t, k, v)
    return t


def test_disabled_transforms_do_not_run_and_order_is_kept():
    t = topic(("a", False), ("b", True), ("c", False))
    resources.check_topic(t)
    assert [u.function_name for u in resources.active_transforms(t.message_transforms)] == ["a", "c"]


@pytest.mark.parametrize("kind", ["compression", "ai_inference"])
def test_transform_kinds_other_than_javascript_are_unimplemented(kind):
    t = topic()
    getattr(t.message_transforms.add(), kind).SetInParent()
    with pytest.raises(Unimplemented, match=rf"message_transforms\[0\]\.{kind}"):
        resources.check_topic(t)


def test_an_empty_transform_is_refused():
    t = topic()
    t.message_transforms.add(disabled=True)
    with pytest.raises(InvalidArgument, match="must set javascript_udf"):
        resources.check_topic(t)


def test_output_only_fields_are_the_servers():
    t = topic(satisfies_pzs=True)
    resources.check_topic(t)
    assert not t.satisfies_pzs and t.state == resources.Topic.State.ACTIVE
