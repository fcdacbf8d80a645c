"""``lookahead-rag demo --serve`` (``make page``): the demo's pipeline then serves the chat page, and its HTTP
endpoint answers the demo tenant (the bundled corpus) without a tenant header, so the page needs no set-up."""

from __future__ import annotations

from pathlib import Path

from lookahead_rag.services import demo


def test_serve_answers_the_demo_tenant_by_default(tmp_path: Path) -> None:
    served = demo.demo_settings(str(tmp_path), demo.parse_args(["--serve", "--rounds", "0"]))
    assert served.http.default_tenant == demo.TENANT and served.http.enabled
    assert served.generator.data_dir == tmp_path / "generator"  # the demo's data stays in its temp dir
    plain = demo.demo_settings(str(tmp_path), demo.parse_args([]))
    assert plain.http.default_tenant == ""  # without --serve nothing changes
