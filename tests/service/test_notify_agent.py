"""`board notify test` through the real agent (root is admin), against a real HTTP receiver: the service's
delivery thread sends it, the CLI follows the outbox, and the secret in the url reaches neither the CLI nor the
agent's log."""

from __future__ import annotations

from tests.integration.test_notify import Receiver
from tests.service.support import board_cli


def test_notify_test_through_the_agent(make_agent):
    receiver = Receiver()
    try:
        agent = make_agent(start=False)
        with agent.config.open("a") as config:
            # No summary: started between 09:00 and 10:00, the agent would push the 09:00 one first.
            config.write('\n[notify]\nsummary_at = []\n'
                         f'[[notify.targets]]\nname = "team"\ntype = "wecom"\nurl = "{receiver.url("wecom-ok")}"\n'
                         f'[[notify.targets]]\nname = "ops"\ntype = "slack"\nurl = "{receiver.url("fail")}"\n')
        agent.start()
        rc, out, err = board_cli("notify", "test", env={"BOARD_CONFIG": str(agent.config)})
        where = f"127.0.0.1:{receiver.port}"
        assert (rc, err) == (1, "")
        assert out.splitlines() == [f"team (wecom, {where}): HTTP 200, sent",
                                    f"ops (slack, {where}): HTTP 500, not sent: HTTP 500 Internal Server Error"]
        assert receiver.bodies("wecom-ok")[0]["markdown"]["content"].startswith("**board: a test message**")
        rc, out, err = board_cli("log", "--json", env={"BOARD_CONFIG": str(agent.config)})
        assert '"notify-test"' in out
        log = agent.log_text()
        assert f"notify: test #2 to ops (slack, {where}): HTTP 500 Internal Server Error (given up)" in log
        for text in (out, err, log):
            assert "SEKRIT" not in text
    finally:
        receiver.close()
