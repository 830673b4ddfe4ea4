"""replay/common/object_gateway.py: a directory not on an object-storage gateway has none; a gateway daemon's
options are recorded with every secret's value hidden, in `-o a=b,c=d` lists and `--flag=value` / `--flag value`
forms (the real gateway, s3fs on a Ceph bucket, is in tests/kvconnector/test_s3_tier.py)."""

from __future__ import annotations

import pytest

from replay.common.object_gateway import _hide_secrets, gateway_of


def test_a_local_directory_has_no_gateway(tmp_path):
    assert gateway_of(str(tmp_path)) is None and gateway_of("/") is None


@pytest.mark.parametrize(
    "arg,shown",
    [
        ("url=http://10.0.0.2:7480,use_path_request_style,passwd_file=/k", "url=http://10.0.0.2:7480,"
         "use_path_request_style,passwd_file=***"),
        ("--s3-secret-access-key=abc", "--s3-secret-access-key=***"),
        ("--s3-access-key-id=AKIA", "--s3-access-key-id=***"),
        ("session_token=t,allow_other", "session_token=***,allow_other"),
        ("--vfs-cache-mode=writes", "--vfs-cache-mode=writes"),
        ("remote:bucket", "remote:bucket"),
    ],
)  # fmt: skip
def test_secret_values_are_hidden_and_the_rest_kept(arg, shown):
    assert _hide_secrets(arg) == shown
