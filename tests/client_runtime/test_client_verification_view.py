"""Verification in what the client tells people: the local metrics endpoint (`snapshot`),
its OpenTelemetry metrics (`ClientTelemetry`) and its TUI's verification line and
ejection notice. The client around them is a stand-in holding the real Counters and
EventLog (the runtime updates those; runtime/verifying.py)."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families
from textual.widgets import Static

from client_image.runtime.events import Ejected, Following, ResultVerified
from client_image.runtime.observability import Counters, snapshot
from client_image.runtime.tui import ClientApp, ejected_notice, verification_lines
from client_image.telemetry import ClientTelemetry
from psyche_common.metrics_schema import ClientMetrics
from psyche_common.telemetry import ServiceIdentity, Telemetry, TelemetryOptions
from tests.client_runtime.standin_client import StandInClient

ALICE, BOB, CAROL = "a1" * 32, "b2" * 32, "c3" * 32


def verifying_counters() -> Counters:
    counters = Counters(verifications_passed=14, verifications_failed=1,
                        verification_reports_sent=1)
    counters.observe(Following(epoch=2, trainers=(ALICE, BOB)))
    return counters


def test_the_local_metrics_carry_the_verification_counters_and_the_ejection() -> None:
    counters = verifying_counters()
    metrics = snapshot(counters, "0.1.0", None)
    assert (metrics.verification_following, metrics.verifications_passed,
            metrics.verifications_failed, metrics.verification_reports_sent) == (2, 14, 1, 1)
    assert not metrics.ejected and metrics.ejected_epoch is None and metrics.ejected_by == []

    counters.observe(ResultVerified(of_step=7, trainer=ALICE, ok=True, jaccard=0, hamming=0,
                                    manhattan=0, reason=""))  # counted by the runtime, not here
    counters.observe(Ejected(epoch=3, reporters=(BOB, CAROL)))
    counters.observe(Ejected(epoch=3, reporters=(BOB, CAROL)))  # twice: values, not sums
    served = ClientMetrics.model_validate_json(
        snapshot(counters, "0.1.0", None).model_dump_json())  # what the endpoint serves
    assert served.ejected and served.ejected_epoch == 3 and served.ejected_by == [BOB, CAROL]
    assert served.verification_following == 0  # an ejected client follows nobody
    assert served.verifications_passed == 14

    cannot = Counters()
    cannot.observe(Following(epoch=2, trainers=(ALICE,), able=False))
    assert snapshot(cannot, "", None).verification_following == 0
    # an old metrics JSON (no verification fields) still reads
    assert ClientMetrics.model_validate({"round_step": 1}).verifications_failed == 0


def scrape(telemetry: Telemetry) -> dict[str, float]:
    assert telemetry.prometheus is not None
    text = httpx.get(f"http://127.0.0.1:{telemetry.prometheus.port}/metrics", timeout=5).text
    return {s.name: s.value for family in text_string_to_metric_families(text)
            for s in family.samples}


def test_the_opentelemetry_metrics_carry_the_verification_counters_and_the_ejection() -> None:
    client = StandInClient(counters=verifying_counters(), observe=False)
    telemetry = Telemetry.start(TelemetryOptions(prometheus_port=0),
                                ServiceIdentity("client", ALICE, "run"))
    try:
        ClientTelemetry(telemetry, client)  # type: ignore[arg-type]  # a stand-in client
        series = scrape(telemetry)
        assert series["psyche_verifications_passed_total"] == 14
        assert series["psyche_verifications_failed_total"] == 1
        assert series["psyche_verification_reports_sent_total"] == 1
        assert series["psyche_ejected"] == 0
        client.events.emit(Following(epoch=2, trainers=(BOB, CAROL, ALICE)))
        assert scrape(telemetry)["psyche_verification_following"] == 3
        client.counters.verifications_failed += 1
        client.events.emit(Ejected(epoch=2, reporters=(BOB, CAROL)))
        series = scrape(telemetry)
        assert series["psyche_verifications_failed_total"] == 2
        assert series["psyche_ejected"] == 1 and series["psyche_verification_following"] == 0
    finally:
        telemetry.shutdown()


def test_the_verification_line_and_the_ejected_notice() -> None:
    counters = verifying_counters()
    following = Following(epoch=2, trainers=(ALICE, BOB))
    assert verification_lines(50, following, counters) == [
        "verification 50%: following 2 trainers · 14 passed · 1 failed · 1 report sent"]
    assert verification_lines(0, None, Counters()) == []
    assert verification_lines(None, None, Counters()) == []
    assert verification_lines(None, None, counters)[0].startswith("verification: following no")
    assert "following no trainer yet" in verification_lines(50, None, Counters())[0]
    assert "cannot replay" in verification_lines(
        50, Following(epoch=2, trainers=(ALICE,), able=False), Counters())[0]
    assert ejected_notice(Ejected(epoch=3, reporters=(BOB, CAROL))) == (
        f"EJECTED in epoch 3 by 2 followers ({BOB[:12]}…, {CAROL[:12]}…): "
        "their replays did not reproduce this client's results")


async def test_the_client_tui_shows_verification_and_the_ejection() -> None:
    client = StandInClient(counters=Counters(verifications_passed=5), observe=False)
    app = ClientApp(client, refresh_s=0.05)  # type: ignore[arg-type]  # a stand-in client
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.pause(0.1)
        line = app.query_one("#client-verification", Static)
        assert line.display  # something verified, though the run's state is not known yet
        client.events.emit(Following(epoch=1, trainers=(BOB,)))
        client.counters.verifications_failed = 1
        client.counters.verification_reports_sent = 1
        await pilot.pause(0.15)
        text = str(line.render())
        assert "following 1 trainer · 5 passed · 1 failed · 1 report sent" in text, text
        client.events.emit(Ejected(epoch=1, reporters=(BOB, CAROL)))
        await pilot.pause(0.15)
        text = str(line.render())
        assert f"EJECTED in epoch 1 by 2 followers ({BOB[:12]}…" in text, text
        assert "verification: following 0 trainers" in text  # ejected: follows nobody
        assert [n.severity for n in app._notifications] == ["error"]
        assert "EJECTED in epoch 1" in next(iter(app._notifications)).message
        await pilot.press("q")
        await pilot.pause(0.1)
    assert app.return_value == 0


async def test_the_client_tui_hides_the_line_while_the_run_does_not_verify() -> None:
    client = StandInClient(counters=Counters(), observe=False)
    app = ClientApp(client, refresh_s=0.05)  # type: ignore[arg-type]  # a stand-in client
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.pause(0.1)
        assert not app.query_one("#client-verification", Static).display
        await pilot.press("q")
