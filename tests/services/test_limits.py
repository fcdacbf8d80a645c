"""RequestLimits: one set of request rules, the same refusals from every service."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from lookahead_rag.services.common.errors import InvalidArgument
from lookahead_rag.services.common.rules.limits import RequestLimits
from lookahead_rag.services.draftcache.settings import DraftCacheSettings
from lookahead_rag.services.draftcache.store import DraftCacheStore

LIMITS = RequestLimits(default_k=3, max_k=5, default_m=1, max_m=2, default_max_new_tokens=8, max_new_tokens=16,
                       max_tenant_chars=4, max_question_chars=10, max_prompt_chars=20)


@pytest.mark.parametrize(("resolve", "asked", "expected"), [
    ("resolve_k", 0, 3),  # 0 means the default
    ("resolve_k", 5, 5),  # the limit itself is allowed
    ("resolve_m", 0, 1),  # m has its own default
    ("resolve_m", 2, 2),  # and its own limit
    ("resolve_max_new_tokens", 0, 8),  # the default answer length
    ("resolve_max_new_tokens", 16, 16),  # the longest answer allowed
])
def test_resolve_gives_the_default_for_zero_and_the_value_within_limits(resolve: str, asked: int,
                                                                         expected: int) -> None:
    assert getattr(LIMITS, resolve)(asked) == expected


@pytest.mark.parametrize(("resolve", "asked", "words"), [
    ("resolve_k", 6, "k=6 is out of range (0 = default 3, at most 5)"),  # one over max_k
    ("resolve_k", -1, "k=-1"),  # negative (proto fields are unsigned; Python callers are not)
    ("resolve_m", 3, "m=3"),  # one over max_m
    ("resolve_max_new_tokens", 17, "max_new_tokens=17"),  # one over max_new_tokens
])
def test_resolve_refuses_out_of_range(resolve: str, asked: int, words: str) -> None:
    with pytest.raises(InvalidArgument, match=words.replace("(", r"\(").replace(")", r"\)")):
        getattr(LIMITS, resolve)(asked)


@pytest.mark.parametrize(("tenant", "words"), [
    ("", "tenant is empty"),  # empty
    ("  \t", "tenant is empty"),  # blank
    ("abcde", "tenant is 5 characters; the limit is 4"),  # one over max_tenant_chars
])
def test_bad_tenants_are_refused(tenant: str, words: str) -> None:
    with pytest.raises(InvalidArgument, match=words):
        LIMITS.check_tenant(tenant)


def test_good_tenant_and_question_pass_through() -> None:
    assert LIMITS.check_tenant("acme") == "acme"
    assert LIMITS.check_question("why?") == "why?"


@pytest.mark.parametrize(("question", "words"), [
    ("", "question is empty"),  # empty
    ("\n ", "question is empty"),  # blank
    ("x" * 11, "question is 11 characters; the limit is 10"),  # one over max_question_chars
])
def test_bad_questions_are_refused(question: str, words: str) -> None:
    with pytest.raises(InvalidArgument, match=words):
        LIMITS.check_question(question)


def test_prompt_chars_limit_names_what_was_too_long() -> None:
    LIMITS.check_prompt_chars("prompt", 20)  # at the limit: fine
    with pytest.raises(InvalidArgument, match="references: 21 characters; the limit is 20"):
        LIMITS.check_prompt_chars("references", 21)


@pytest.mark.parametrize("fields", [
    {"default_k": 6, "max_k": 5},  # default over its limit
    {"default_m": 3, "max_m": 2},
    {"default_max_new_tokens": 17, "max_new_tokens": 16},
])
def test_defaults_over_their_limits_are_a_config_error(fields: dict[str, int]) -> None:
    with pytest.raises(ValidationError, match="over its limit"):
        RequestLimits(**fields)


@pytest.mark.parametrize(("tenant", "words"), [
    ("", "tenant is empty"),  # the same empty-tenant refusal as the generator and the retriever
    ("abcde", "the limit is 4"),  # the same length limit
])
def test_draft_cache_refuses_the_same_tenants(tenant: str, words: str) -> None:
    store = DraftCacheStore(DraftCacheSettings(data_dir=None), LIMITS)
    with pytest.raises(InvalidArgument, match=words):
        store.fetch(tenant, "tok", [1], [], 0)
    with pytest.raises(InvalidArgument, match=words):
        store.add_output(tenant, "tok", [1], "e1")
    assert store.fetch("abcd", "tok", [1], [], 0) == []  # at the limit: a tenant with nothing yet
