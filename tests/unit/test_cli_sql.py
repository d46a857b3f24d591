"""`gpulayer sql` reads a real state file, read-only, and prints rows as a table, JSON or CSV."""
from __future__ import annotations

import csv
import io
import json

from gpulayer.cli import main
from helpers import job


def _sql(capsys, *args):
    code = main(["sql", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_sql_prints_rows_as_json_csv_and_a_table(sched, home, capsys):
    first = sched.submit(job(command=("echo", "a"), name="first"))
    sched.submit(job(command=("echo", "b"), name="second"))
    query = "SELECT id, name, state FROM jobs WHERE id >= :since ORDER BY id"

    code, out, _ = _sql(capsys, "--home", str(home), "--json", "-p", f"since={first}", query)
    assert code == 0
    assert [(r["name"], r["state"]) for r in json.loads(out)] == [("first", "queued"), ("second", "queued")]

    code, out, _ = _sql(capsys, "--home", str(home), "--csv", "--param", f"since={first}", query)
    assert code == 0
    assert list(csv.reader(io.StringIO(out)))[0] == ["id", "name", "state"]
    assert len(list(csv.reader(io.StringIO(out)))) == 3

    code, out, _ = _sql(capsys, "--state", str(home / "state.db"), "SELECT count(*) AS n FROM jobs")
    assert code == 0 and out.split() == ["n", "2"]


def test_sql_cannot_change_the_state_file(sched, home, capsys):
    sched.submit(job())
    for statement in ("DELETE FROM jobs", "UPDATE jobs SET priority = 9 RETURNING id"):
        code, _, err = _sql(capsys, "--home", str(home), statement)
        assert code == 2 and err.startswith("Error: refused: the state file is opened read-only") \
            and err.count("\n") == 1, err
    code, out, _ = _sql(capsys, "--home", str(home), "--json", "SELECT priority FROM jobs")
    assert json.loads(out) == [{"priority": 0}]


def test_sql_names_a_bad_query_and_a_missing_state_file(tmp_path, sched, home, capsys):
    code, _, err = _sql(capsys, "--home", str(home), "SELECT * FROM no_such_table")
    assert code == 2 and "no such table" in err  # the statement is at fault: bad input
    code, _, err = _sql(capsys, "--home", str(tmp_path / "elsewhere"), "SELECT 1")
    assert code == 2 and "no state file" in err
