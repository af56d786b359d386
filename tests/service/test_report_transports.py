"""`board report` through either door: the service in process, or the real agent's socket as a member's CLI reaches it."""

import csv
import io
import json


def test_the_report_through_either_transport(target, cli):
    rc, out, err = cli("report", "--since", "7d", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["by"] == "user" and doc["days"] == 7.0
    assert [v["threshold"] for v in doc["verdicts"]] == ["utilisation_low", "utilisation_high", "wait", "vram", "faults",
                                                          "temperature"]
    rc, out, err = cli("report", "--by", "card", "--csv")
    assert rc == 0, err
    assert list(csv.DictReader(io.StringIO(out)))[-1]["key"] == "total"
    rc, out, err = cli("report", "--by", "team")
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
