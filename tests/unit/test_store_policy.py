"""The bucket-policy check that keeps model artifacts private."""

from __future__ import annotations

import json

import pytest

from model_store.s3 import anonymous_read_grants


def policy(*statements: dict) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": list(statements)})


def allow(principal, action, **extra) -> dict:
    return {"Effect": "Allow", "Principal": principal, "Action": action, "Resource": "*", **extra}


@pytest.mark.parametrize(
    "principal, action",
    [
        ("*", "s3:GetObject"),
        ({"AWS": "*"}, ["s3:GetObject"]),
        ({"AWS": ["*"]}, "s3:*"),
        ("*", "*"),
        ("*", "s3:Get*"),
        ("*", "S3:GETOBJECT"),  # IAM action names are case-insensitive
        ("*", "s3:ListBucket"),  # listing names is reading too
    ],
)
def test_statement_letting_anyone_read_is_reported(principal, action):
    grants = anonymous_read_grants(policy(allow(principal, action, Sid="Open")))
    assert len(grants) == 1 and grants[0].startswith("statement Open allows")


def test_policy_with_only_named_principals_or_denies_is_private():
    text = policy(
        allow({"AWS": ["arn:aws:iam::123456789012:user/relay"]}, "s3:*"),
        {"Effect": "Deny", "Principal": "*", "Action": "s3:GetObject", "Resource": "*"},
        allow("*", "s3:PutObject"),  # anonymous uploads are bad, but not a read leak
    )
    assert anonymous_read_grants(text) == []


def test_not_action_that_leaves_reads_allowed_is_reported():
    statement = {
        "Effect": "Allow",
        "Principal": "*",
        "NotAction": "s3:DeleteObject",
        "Resource": "*",
    }
    assert anonymous_read_grants(policy(statement)) == [
        "statement #0 allows s3:GetObject, s3:ListBucket to anyone"
    ]
    statement["NotAction"] = ["s3:Get*", "s3:List*"]
    assert anonymous_read_grants(policy(statement)) == []


def test_not_principal_allow_reaches_anonymous_callers():
    statement = {
        "Effect": "Allow",
        "NotPrincipal": {"AWS": "arn:aws:iam::123456789012:root"},
        "Action": "s3:GetObject",
        "Resource": "*",
    }
    assert anonymous_read_grants(policy(statement))


def test_single_statement_object_and_empty_policy_are_understood():
    single = json.dumps({"Statement": allow("*", "s3:GetObject")})
    assert anonymous_read_grants(single)
    assert anonymous_read_grants(json.dumps({"Statement": []})) == []


def test_policy_that_is_not_json_is_an_error_not_private():
    with pytest.raises(ValueError, match="not JSON"):
        anonymous_read_grants("{oops")
