"""The Wallet panel's rewards and its claim (key c, a confirmation dialog), this operator's
client in the client list, the P2P panel and the image pull's progress bar.

The claims go to a real treasurer run: our programs in LiteSVM, an epoch played by two
clients (the operator's wallet one of them) so that the wallet has earned points, then
served over JSON-RPC on loopback (psyche_solana.localnet) to the real `SolanaRewards`.
The panels are otherwise driven with typed data, as in test_rm_tui.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from solders.keypair import Keypair
from test_rm_tui import BOB, text_of
from textual.widgets import ProgressBar

from psyche_common.metrics_schema import ClientMetrics, ConnectedPeer
from psyche_common.run_view import RunClient, RunSnapshot
from psyche_solana.localnet import Localnet, LocalValidator
from psyche_solana.rewards import RewardStatus
from psyche_solana.scenario import SvmRun
from run_manager.docker_supervisor import ContainerStarted, ImagePull
from run_manager.monitor import Monitor
from run_manager.rewards import RewardsUnavailable, SolanaRewards
from run_manager.sources import PinnedVersionSource
from run_manager.tui.app import RunManagerApp
from run_manager.tui.messages import DashboardChanged, SupervisorEventPosted
from run_manager.tui.widgets import ClaimScreen
from run_manager.view import Dashboard, same_key
from tests.run_manager.tui_setup import played_treasurer_run

try:  # the pull's progress moves from the engine to its own module (registry pulls)
    from run_manager.image_pull import PullProgress
except ImportError:
    from run_manager.engine import PullProgress  # type: ignore[no-redef]  # the older home

OPERATOR = Keypair.from_seed(bytes([7]) * 32)
MINT = Keypair.from_seed(bytes([9]) * 32).pubkey()
TreasurerRun = tuple[Localnet, SvmRun, str]
NOWHERE = "http://127.0.0.1:9"  # never asked: these apps are not offered a claim or cancel it


def rewards_dashboard(status: RewardStatus | None = None) -> Dashboard:
    """The operator's client listed as the coordinator lists it (hex), 120 points earned,
    20 claimed; the client's metrics twice, 2 s apart, with 3 peers."""
    dashboard = Dashboard()
    dashboard.wallet.address = str(OPERATOR.pubkey())
    dashboard.wallet.balance_lamports = 1_500_000_000
    dashboard.apply_run(RunSnapshot(
        run_id="llama2-20m", phase="RoundTrain", epoch=2, step=41,
        clients=[RunClient(id=bytes(OPERATOR.pubkey()).hex(), points=120),
                 RunClient(id=BOB, points=80)]))
    dashboard.wallet.apply_rewards(status or RewardStatus(120, 20, MINT, 6, 20))
    peers = [ConnectedPeer(endpoint_id="aa", connection_type="direct"),
             ConnectedPeer(endpoint_id="bb", connection_type="direct"),
             ConnectedPeer(endpoint_id="cc", connection_type="relay")]
    dashboard.apply_metrics(ClientMetrics(connected_peers=peers, p2p_bytes_sent=10_000,
                                          p2p_bytes_received=100_000), now=10.0)
    dashboard.apply_metrics(ClientMetrics(connected_peers=peers, p2p_bytes_sent=12_048,
                                          p2p_bytes_received=4_294_304), now=12.0)
    return dashboard


def test_a_client_listed_in_hex_is_this_wallet_in_base58() -> None:
    wallet = str(OPERATOR.pubkey())
    assert same_key(bytes(OPERATOR.pubkey()).hex(), wallet) and same_key(wallet, wallet)
    assert not same_key(bytes(Keypair().pubkey()).hex(), wallet)
    assert not same_key("not a key", wallet) and not same_key(wallet, "not a key")


async def test_wallet_panel_shows_points_claimable_and_the_token_balance() -> None:
    app = RunManagerApp(rewards_dashboard())
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        lines = text_of(app, "#wallet").splitlines()
        assert lines[0] == f"wallet {OPERATOR.pubkey()}  balance 1.500000000 SOL  points 120"
        assert lines[1] == ("rewards: 120 earned · 20 claimed · 100 claimable · "
                            "reward token 0.00002 (20 base units)")
        table = app.query_one("#run-clients")
        own = table.get_row(bytes(OPERATOR.pubkey()).hex())  # type: ignore[attr-defined]  # a DataTable
        wallet = str(OPERATOR.pubkey())
        assert own[0] == f"ea4a6c…46d22c (you: {wallet[:6]}…{wallet[-6:]})" and own[2] == "120"
        assert "you" not in table.get_row(BOB)[0]  # type: ignore[attr-defined]  # a DataTable


async def test_p2p_panel_shows_rates_and_direct_and_relayed_peers() -> None:
    dashboard = rewards_dashboard()
    app = RunManagerApp(dashboard)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert text_of(app, "#p2p-summary").splitlines() == ["↑ 1.0 KiB/s  ↓ 2.0 MiB/s",
                                                     "peers 3: 2 direct, 1 relayed"]
        # Connections closed: the counters go down; no negative rate, the next one is fresh.
        dashboard.apply_metrics(ClientMetrics(p2p_bytes_sent=0, p2p_bytes_received=0), now=13.0)
        dashboard.apply_metrics(ClientMetrics(connected_peers=[ConnectedPeer(endpoint_id="dd")],
                                              p2p_bytes_sent=512, p2p_bytes_received=0), now=14.0)
        app.post_message(DashboardChanged("training"))
        await pilot.pause()
        assert text_of(app, "#p2p-summary").splitlines() == ["↑ 512 B/s  ↓ 0 B/s",
                                                     "peers 1: 0 direct, 0 relayed, 1 path unknown"]
    empty = RunManagerApp(Dashboard())
    async with empty.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert text_of(empty, "#p2p-summary") == "p2p: no client metrics"


async def test_the_model_fetch_from_peers_shows_a_progress_bar_until_it_is_done() -> None:
    dashboard = rewards_dashboard()
    app = RunManagerApp(dashboard)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        bar = app.query_one("#p2p-model", ProgressBar)
        assert not bar.display  # no fetch yet
        dashboard.apply_metrics(ClientMetrics(model_params_downloaded=300_000,
                                              model_params_total=1_200_000), now=20.0)
        app.post_message(DashboardChanged("training"))
        await pilot.pause()
        assert bar.display and (bar.progress, bar.total) == (300_000, 1_200_000)
        assert text_of(app, "#p2p-summary").splitlines()[-1] == (
            "model from peers: 25% of 1200000 parameters")
        dashboard.apply_metrics(ClientMetrics(model_params_downloaded=1_200_000,
                                              model_params_total=1_200_000), now=21.0)
        app.post_message(DashboardChanged("training"))
        await pilot.pause()
        assert not bar.display
        assert "model from peers" not in text_of(app, "#p2p-summary")


async def test_the_image_pull_shows_a_progress_bar_until_the_container_starts() -> None:
    app = RunManagerApp(Dashboard())
    async with app.run_test(size=(120, 40)) as pilot:
        bar = app.query_one("#container-pull", ProgressBar)
        assert not bar.display
        app.post_message(SupervisorEventPosted(ImagePull(PullProgress(
            "psyche-client:0.2.0", "Downloading", 30 << 20, 120 << 20))))
        await pilot.pause()
        assert bar.display and (bar.progress, bar.total) == (30 << 20, 120 << 20)
        assert "pulling 25%" in text_of(app, "#container-summary")
        app.post_message(SupervisorEventPosted(ContainerStarted("c0ffee", "psyche-client:0.2.0",
                                                                "0.2.0", 0)))
        await pilot.pause()
        assert not bar.display


async def test_claim_is_not_offered_on_tcp_runs_or_without_a_treasurer() -> None:
    no_treasurer = RewardStatus(120, 0)  # points, but no reward token
    for dashboard, rewards in ((rewards_dashboard(), None),  # a TCP run: no rewards source
                               (rewards_dashboard(no_treasurer),
                                SolanaRewards([NOWHERE], "llama2-20m", OPERATOR))):
        app = RunManagerApp(dashboard, rewards=rewards)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("c")
            await pilot.pause()
            assert not isinstance(app.screen, ClaimScreen)
            assert app.check_action("claim", ()) is False
            if rewards is not None:
                assert "no reward token (the run has no treasurer)" in text_of(app, "#wallet")


async def test_cancelling_the_claim_dialog_sends_nothing() -> None:
    app = RunManagerApp(rewards_dashboard(), rewards=SolanaRewards([NOWHERE], "r", OPERATOR))
    async with app.run_test(size=(120, 40)) as pilot:
        for cancel in ("escape", "n", "#claim-cancel"):
            await pilot.press("c")
            await pilot.pause()
            assert isinstance(app.screen, ClaimScreen)
            assert app.screen.question.startswith("Claim 100 points = 0.0001 reward tokens")
            await (pilot.click(cancel) if cancel.startswith("#") else pilot.press(cancel))
            await pilot.pause()
            assert not isinstance(app.screen, ClaimScreen)
        assert app.dashboard.wallet.last_claim == ""  # nothing was sent (NOWHERE would fail)


def test_snapshot_wallet_rewards_and_p2p(snap_compare: Any) -> None:
    assert snap_compare(RunManagerApp(rewards_dashboard()), terminal_size=(120, 40))


def test_snapshot_claim_dialog(snap_compare: Any) -> None:
    app = RunManagerApp(rewards_dashboard(), rewards=SolanaRewards([NOWHERE], "r", OPERATOR))
    assert snap_compare(app, press=["c"], terminal_size=(120, 40))


# ---------------------------------------------------------------- a real treasurer run
@pytest.fixture(scope="module")
def treasurer_run() -> Iterator[TreasurerRun]:
    """An epoch played by the operator and one other client (500 points each), served
    over JSON-RPC; its reward vault still empty."""
    run = played_treasurer_run(OPERATOR)
    assert run.account().earned(OPERATOR.pubkey()) == 500
    with Localnet(validator=LocalValidator(run.svm)) as net:
        yield net, run, run.account().run_id


async def test_the_monitor_reads_the_wallets_rewards_from_the_chain(
        treasurer_run: TreasurerRun) -> None:
    net, _run, run_id = treasurer_run
    dashboard = Dashboard()
    dashboard.wallet.address = str(OPERATOR.pubkey())
    rewards = SolanaRewards([net.url], run_id, OPERATOR)
    monitor = Monitor(dashboard, PinnedVersionSource("v1"), None, lambda part: None,
                      rpc_url=net.url, rewards=rewards)
    try:
        await monitor.poll_once()
    finally:
        await rewards.close()
    assert dashboard.wallet.error == ""
    assert dashboard.wallet.points == 500 and dashboard.wallet.rewards is not None
    assert dashboard.wallet.rewards.claimable == 500 and dashboard.wallet.can_claim
    missing = SolanaRewards([net.url], "no-such-run", OPERATOR)
    with pytest.raises(RewardsUnavailable, match=r"^rewards: no run 'no-such-run' on this cluster"):
        await missing.status()
    await missing.close()


async def test_a_confirmed_claim_pays_the_wallet_or_says_why_not(
        treasurer_run: TreasurerRun) -> None:
    net, run, run_id = treasurer_run
    rewards = SolanaRewards([net.url], run_id, OPERATOR)
    dashboard = Dashboard()
    dashboard.wallet.address = str(OPERATOR.pubkey())
    app = RunManagerApp(dashboard, rewards=rewards)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            dashboard.wallet.apply_rewards(await rewards.status())
            app.refresh_panels("wallet")

            async def claim() -> str:
                await pilot.press("c")
                await pilot.pause()
                assert isinstance(app.screen, ClaimScreen)
                await pilot.click("#claim-confirm")
                await app.workers.wait_for_complete()
                await pilot.pause()
                return text_of(app, "#wallet").splitlines()[-1]

            # The vault is empty: the program refuses, and the panel says so in one line.
            refused = await claim()
            assert refused.startswith("claim failed: claim: ") and "\n" not in refused
            assert refused.endswith(
                "token program error 1 (InsufficientFunds): the run's reward vault holds fewer "
                "reward tokens than this claim is owed; the run's owner must top it up "
                "(treasurer-top-up-rewards), then claim again"), refused
            assert (await rewards.status()).claimed == 0
            run.top_up(700)
            paid = await claim()
            assert paid == "claimed 500 points: reward token balance now 0.0005"
            assert "0 claimable · reward token 0.0005 (500 base units)" in text_of(app, "#wallet")
            assert app.check_action("claim", ()) is True
            await pilot.press("c")  # nothing left: a notification, no dialog
            await pilot.pause()
            assert not isinstance(app.screen, ClaimScreen)
    finally:
        await rewards.close()
    assert run.token_balance(OPERATOR.pubkey()) == 500
