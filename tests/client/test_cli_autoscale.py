"""`submit`'s autoscaling options (issue 39): into `service.autoscale`, and each bad one a usage error (exit 2)
before anything is sent; the Python client's `service(autoscale=...)` the same."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpulayer.cli.app import app
from gpulayer.client.specs import service

runner = CliRunner()
SERVE = ["submit", "--dry-run", "--json", "--service"]


def test_the_options_make_service_autoscale():
    result = runner.invoke(app, [*SERVE, "--ingress", "token", "--min-replicas", "0", "--max-replicas", "4", "--target-concurrency", "2",
                                 "--scale-up-after", "5s", "--scale-down-after", "2m", "--cold-start-timeout", "30", "--", "serve"])
    assert result.exit_code == 0, result.output
    block = json.loads(result.output)["service"]
    assert block["autoscale"] == {"min": 0, "max": 4, "target_concurrency": 2.0, "up_after_s": 5.0, "down_after_s": 120.0,
                                  "cold_start_timeout_s": 30.0}
    assert "replicas" not in block   # the server starts it at min (at least one)


@pytest.mark.parametrize("args, words", [
    (["--max-replicas", "4", "--", "serve"], "add --ingress"),
    (["--ingress", "token", "--min-replicas", "0", "--", "serve"], "needs --max-replicas"),
    (["--ingress", "token", "--min-replicas", "5", "--max-replicas", "4", "--", "serve"], "must be at most --max-replicas"),
    (["--ingress", "token", "--max-replicas", "0", "--", "serve"], "--max-replicas"),
    (["--ingress", "token", "--max-replicas", "2", "--target-concurrency", "0", "--", "serve"], "must be above 0"),
    (["--ingress", "token", "--max-replicas", "2", "--cold-start-timeout", "soon", "--", "serve"], "is not a duration"),
])
def test_bad_autoscaling_options_exit_2(args, words):
    result = runner.invoke(app, [*SERVE, *args])
    assert result.exit_code == 2 and words in result.output, result.output


def test_without_service_it_is_a_usage_error():
    result = runner.invoke(app, ["submit", "--dry-run", "--ingress", "token", "--max-replicas", "2", "--", "serve"])
    assert result.exit_code == 2 and "add --service" in result.output, result.output


def test_the_python_client():
    spec = service(["serve"], ingress="token", autoscale={"min": 0, "max": 3})
    assert spec["service"]["autoscale"] == {"min": 0, "max": 3} and "replicas" not in spec["service"]
    assert service(["serve"], ingress="token", replicas=2, autoscale={"max": 3})["service"]["replicas"] == 2
    with pytest.raises(ValueError, match="ingress"):
        service(["serve"], autoscale={"max": 3})
    with pytest.raises(ValueError, match="autoscale is a dict"):
        service(["serve"], ingress="token", autoscale=3)
