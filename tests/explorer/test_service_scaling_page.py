"""The explorer's job page shows an autoscaled service's replicas over time (issue 39): its `service_scaling`
rows, oldest first; a job without any shows no such section."""
from __future__ import annotations

from pathlib import Path

import apsw
import falcon.testing

from explorer import create_app


def test_job_page_shows_replicas_over_time(state: Path) -> None:
    conn = apsw.Connection(str(state))
    conn.execute("INSERT INTO service_scaling (job_id, at, from_replicas, to_replicas, why, load, in_flight, ready) "
                 "VALUES (8, 1000, 1, 4, 'up', 3.9, 4, 1), (8, 1100, 4, 2, 'down', 0.75, 3, 4)")
    conn.close()
    client = falcon.testing.TestClient(create_app(str(state)))
    page = client.simulate_get("/-/jobs/8").text
    assert "<h2>Replicas over time" in page
    section = page.split("<h2>Replicas over time", 1)[1].split("<h2>", 1)[0]
    assert section.index(">up<") < section.index(">down<") and "3.9" in section
    assert "<h2>Replicas over time" not in client.simulate_get("/-/jobs/1").text
